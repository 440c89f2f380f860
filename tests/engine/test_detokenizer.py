"""Incremental detokenization: streamed deltas add up to the full text; stop strings cut it."""

import pytest
from tokenizers import Tokenizer

from engine.core.detokenizer import IncrementalDetokenizer
from normalize.chat_tokenizer import ChatTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return ChatTokenizer.load("smollm2-135m").tokenizer


def stream(tokenizer: Tokenizer, text: str, stop: list[str]) -> tuple[list[str], IncrementalDetokenizer]:
    detokenizer = IncrementalDetokenizer(tokenizer, stop)
    deltas = []
    token_ids = tokenizer.encode(text, add_special_tokens=False).ids
    for index, token_id in enumerate(token_ids):
        detokenizer.add_token(token_id)
        deltas.append(detokenizer.take_delta(final=index == len(token_ids) - 1 or detokenizer.stopped))
        if detokenizer.stopped:
            break
    return deltas, detokenizer


def test_deltas_join_to_the_decoded_text_with_multibyte_characters(tokenizer: Tokenizer) -> None:
    text = "Café crème 🙂 costs 3€, naïve façade."
    deltas, _ = stream(tokenizer, text, [])
    assert "".join(deltas) == text


def test_stop_string_split_across_tokens_is_never_streamed(tokenizer: Tokenizer) -> None:
    deltas, detokenizer = stream(tokenizer, "The answer is Paris. END of story", ["END of"])
    assert detokenizer.stopped
    assert "".join(deltas) == "The answer is Paris. "
    assert not any("END" in delta for delta in deltas)


def test_earliest_of_several_stop_strings_wins(tokenizer: Tokenizer) -> None:
    deltas, detokenizer = stream(tokenizer, "one two three four", ["four", "two"])
    assert detokenizer.stopped and "".join(deltas) == "one "


def test_special_tokens_are_not_rendered(tokenizer: Tokenizer) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    for token_id in tokenizer.encode("Hi", add_special_tokens=False).ids + [tokenizer.token_to_id("<|im_end|>")]:
        detokenizer.add_token(token_id)
    assert detokenizer.take_delta(final=True) == "Hi"
