"""Word-by-word tokenization of ASCII text gives the HF tokenizer's ids, and only where it can."""

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from normalize.byte_level_words import MAX_DOMAINS, ByteLevelWords
from normalize.chat_tokenizer import ChatTokenizer

FRAGMENTS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", " ", "   ", "\n", "\r\n", "\t"]
FRAGMENTS += ["\x0b", "\x1c", "12", "ab"]
ascii_texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(st.characters(max_codepoint=127), max_size=10)), max_size=12
).map("".join)


@pytest.fixture(scope="module")
def words(chat_tokenizer: ChatTokenizer) -> ByteLevelWords:
    found = ByteLevelWords.for_tokenizer(chat_tokenizer.tokenizer, added_tokens_split=True)
    assert found is not None, "the bundled SmolLM2 tokenizer is byte-level BPE"
    return found


@settings(max_examples=500, deadline=None)
@given(text=ascii_texts)
def test_ascii_text_gets_the_tokenizers_ids(chat_tokenizer: ChatTokenizer, words: ByteLevelWords, text: str) -> None:
    expected = chat_tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    assert words.encode(text) == expected
    assert words.encode(text) == expected, "again, from cached words"


def test_long_words_are_not_cached(chat_tokenizer: ChatTokenizer, words: ByteLevelWords) -> None:
    text = "x" + "." * 500 + " " * 300 + "y"
    assert words.encode(text) == chat_tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    assert all(len(word) <= 64 for learned in words._learned.values() for word in learned)


def test_other_text_is_left_to_the_tokenizer(words: ByteLevelWords) -> None:
    assert words.encode("café") is None
    assert words.encode("plain") is not None


@pytest.mark.parametrize(
    "edit",
    [
        lambda tokenizer: setattr(tokenizer, "normalizer", normalizers.Lowercase()),
        lambda tokenizer: setattr(tokenizer, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda tokenizer: setattr(tokenizer, "pre_tokenizer", pre_tokenizers.Metaspace()),
    ],
    ids=["normalizer", "prefix-space", "metaspace"],
)
def test_other_pipelines_do_not_qualify(
    tokenizer_copy: Callable[..., ChatTokenizer], edit: Callable[[Tokenizer], None]
) -> None:
    assert ByteLevelWords.for_tokenizer(tokenizer_copy(edit=edit).tokenizer, added_tokens_split=True) is None


def test_added_tokens_left_in_the_text_disqualify(chat_tokenizer: ChatTokenizer) -> None:
    assert ByteLevelWords.for_tokenizer(chat_tokenizer.tokenizer, added_tokens_split=False) is None


def test_vocabulary_words_start_cached_with_the_tokenizers_ids(
    chat_tokenizer: ChatTokenizer, words: ByteLevelWords
) -> None:
    assert len(words._vocabulary) > 10_000, "SmolLM2's vocabulary is mostly ASCII words"
    for word in sorted(words._vocabulary)[::97]:
        assert list(words._vocabulary[word]) == chat_tokenizer.tokenizer.encode(word, add_special_tokens=False).ids


def test_entries_known_whole_give_the_same_vocabulary_without_bpe(
    chat_tokenizer: ChatTokenizer, words: ByteLevelWords
) -> None:
    """Where tiktoken's check proved BPE gives every entry as itself, the entries are taken as
    they are: the same ids as through BPE."""
    whole = ByteLevelWords.for_tokenizer(chat_tokenizer.tokenizer, added_tokens_split=True, entries_whole=True)
    assert whole is not None and whole._vocabulary == words._vocabulary


def test_words_learned_in_one_isolation_domain_stay_there(chat_tokenizer: ChatTokenizer) -> None:
    """Issue 28.5: a word cached for one cache salt must not make another salt's request faster."""
    words = ByteLevelWords.for_tokenizer(chat_tokenizer.tokenizer, added_tokens_split=True)
    assert words is not None
    text = " zqxvjw kvgateprobe qqzzyy"
    expected = chat_tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    assert words.encode(text, "tenant-a") == expected
    assert "kvgateprobe" not in words._vocabulary and " kvgateprobe" in words._learned["tenant-a"]
    for salt in (None, "tenant-b"):
        assert words.encode(" hello", salt) is not None
        assert " kvgateprobe" not in words._learned[salt]
    assert words.encode(text, "tenant-b") == expected


def test_isolation_domains_are_bounded(chat_tokenizer: ChatTokenizer) -> None:
    words = ByteLevelWords.for_tokenizer(chat_tokenizer.tokenizer, added_tokens_split=True)
    assert words is not None
    for index in range(MAX_DOMAINS + 5):
        words.encode(f" zqxword{index}", f"salt-{index}")
    assert len(words._learned) == MAX_DOMAINS
    assert "salt-0" not in words._learned and f"salt-{MAX_DOMAINS + 4}" in words._learned
