"""Cutting long text for parallel tokenization: exact on the bundled tokenizer, refused where not."""

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, normalizers

from normalize.chat_tokenizer import ChatTokenizer
from normalize.segment_tokenizer import SegmentTokenizer
from normalize.text_chunks import cut, cuts_are_exact

WORDS = ["the", "Gateway", "it's", "ROUTES", "42", "3.14", "café", "東京", "😀", "don't", "a", "I", "x", "ab-cd"]
SEPARATORS = [" ", "  ", "\n", "\n\n", "\t", ". ", ", ", " \n", "\r\n", ""]
texts = st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(SEPARATORS)), max_size=60).map(
    lambda parts: "".join(word + separator for word, separator in parts)
)


@settings(max_examples=300, deadline=None)
@given(text=texts, size=st.integers(min_value=1, max_value=40))
def test_pieces_tokenize_as_the_whole_text(chat_tokenizer: ChatTokenizer, text: str, size: int) -> None:
    pieces = cut(text, size)
    assert "".join(pieces) == text
    assert all(len(piece) >= size for piece in pieces[:-1])
    assert [token for piece in pieces for token in chat_tokenizer.encode_text(piece)] == chat_tokenizer.encode_text(
        text
    )


def test_cuts_only_before_a_space_between_letters() -> None:
    assert cut("ab cd ef gh", 1) == ["ab", " cd", " ef", " gh"]
    assert cut("12 34. 56\n78", 1) == ["12 34. 56\n78"]
    assert cut("one long line" * 3, 100) == ["one long line" * 3]


def test_the_bundled_tokenizer_passes_the_self_test(chat_tokenizer: ChatTokenizer) -> None:
    assert cuts_are_exact(chat_tokenizer.tokenizer, chat_tokenizer.encode_text)
    assert SegmentTokenizer(chat_tokenizer).chunk_chars is not None
    assert SegmentTokenizer(chat_tokenizer, chunk_chars=None).chunk_chars is None


def test_a_stripping_normalizer_turns_cutting_off(tokenizer_copy: Callable[..., ChatTokenizer]) -> None:
    def strip(tokenizer: Tokenizer) -> None:
        tokenizer.normalizer = normalizers.Strip()

    chat = tokenizer_copy(edit=strip)
    assert not cuts_are_exact(chat.tokenizer, chat.encode_text)
    assert SegmentTokenizer(chat).chunk_chars is None


def test_an_added_token_with_a_cut_inside_turns_cutting_off(tokenizer_copy: Callable[..., ChatTokenizer]) -> None:
    def add_phrase(tokenizer: Tokenizer) -> None:
        tokenizer.add_tokens([AddedToken("kvgate rocks", normalized=False)])

    chat = tokenizer_copy(edit=add_phrase)
    assert not cuts_are_exact(chat.tokenizer, chat.encode_text)
