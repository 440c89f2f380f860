"""Prompts drawn from the round-trip vocabulary encode back to exactly the same token ids."""

import random

from bench.harness.text_vocab import round_trip_vocab
from bench.workloads.token_blocks import random_tokens
from normalize.chat_tokenizer import ChatTokenizer


def test_round_trip_vocab_decodes_and_encodes_to_the_same_ids() -> None:
    tokenizer = ChatTokenizer.load("smollm2-135m")
    vocab = round_trip_vocab(tokenizer)
    assert len(vocab) > 10_000 and min(vocab) >= 17
    rng = random.Random(0)
    for _ in range(20):
        prompt = list(random_tokens(rng, 300, vocab))
        assert tokenizer.encode_text(tokenizer.decode(prompt)) == prompt
