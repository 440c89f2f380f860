"""A byte-level tokenizer converted by transformers 5.17 is kept in the plain form: the same ids, and
the fast tokenizer paths take it (they declined 5.17's form, leaving the gateway to HF alone)."""

import json
import random
from typing import Any

from tokenizers import Tokenizer

from normalize.byte_level_spec import plain_byte_level, with_plain_decoder
from normalize.byte_level_words import ByteLevelWords
from normalize.chat_tokenizer import ChatTokenizer
from normalize.tiktoken_bpe import TiktokenBpe
from tests.normalize.transformers_517 import as_converted_by_517

PROBES = ["Hello, world! It's 2026.", "café 東京 😀"]


def spec_of(chat_tokenizer: ChatTokenizer) -> dict[str, Any]:
    return json.loads(chat_tokenizer.tokenizer.to_str())


def tokenizer_of(spec: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(spec))


def test_the_517_form_made_plain_tokenizes_as_the_plain_one(chat_tokenizer: ChatTokenizer) -> None:
    plain = spec_of(chat_tokenizer)
    converted = tokenizer_of(as_converted_by_517(plain))
    made_plain = tokenizer_of(plain_byte_level(as_converted_by_517(plain)))
    reference = chat_tokenizer.tokenizer
    control = "a\x04b"
    assert converted.encode(control).ids != reference.encode(control).ids, (
        "5.17's form turns a dropped byte into a token"
    )
    rng = random.Random(3)
    alphabet = [chr(code) for code in range(0x300)] + list("東京データ😀 \n\t") + ["<|im_start|>", "<|endoftext|>"]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80)))
        assert made_plain.encode(text).ids == reference.encode(text).ids, repr(text)
    assert made_plain.decode(made_plain.encode("héllo 東京").ids) == "héllo 東京"


def test_the_fast_paths_decline_the_517_form_and_take_it_made_plain(chat_tokenizer: ChatTokenizer) -> None:
    converted = as_converted_by_517(spec_of(chat_tokenizer))
    assert TiktokenBpe.for_tokenizer(tokenizer_of(converted), PROBES, vocabulary_checked=True) is None
    assert ByteLevelWords.for_tokenizer(tokenizer_of(converted), added_tokens_split=True) is None
    made_plain = tokenizer_of(plain_byte_level(converted))
    assert TiktokenBpe.for_tokenizer(made_plain, PROBES, vocabulary_checked=True) is not None
    assert ByteLevelWords.for_tokenizer(made_plain, added_tokens_split=True) is not None


def test_a_plain_tokenizer_is_left_as_it_is(chat_tokenizer: ChatTokenizer) -> None:
    plain = spec_of(chat_tokenizer)
    assert plain_byte_level(plain) == plain
    assert with_plain_decoder(plain) is plain


def test_a_tokenizer_that_is_not_byte_level_is_left_alone(chat_tokenizer: ChatTokenizer) -> None:
    converted = as_converted_by_517(spec_of(chat_tokenizer))
    metaspace = {
        **converted,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"},
    }
    assert plain_byte_level(metaspace) is metaspace
    assert with_plain_decoder(metaspace) is metaspace
