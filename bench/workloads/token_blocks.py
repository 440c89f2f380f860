"""Pseudo-random token ids for synthetic prompts, reproducible from a seed."""

import random
from collections.abc import Sequence

SMOLLM2_VOCAB_SIZE = 49152
FIRST_ORDINARY_TOKEN = 17
"""SmolLM2's ids 0..16 are special tokens (<|endoftext|>, <|im_start|>, ...)."""

DEFAULT_VOCAB: Sequence[int] = range(FIRST_ORDINARY_TOKEN, SMOLLM2_VOCAB_SIZE)


def random_tokens(rng: random.Random, count: int, vocab: Sequence[int] = DEFAULT_VOCAB) -> tuple[int, ...]:
    return tuple(rng.choices(vocab, k=count))


def seeded_block(seed: int, count: int, vocab: Sequence[int] = DEFAULT_VOCAB) -> tuple[int, ...]:
    """The block of ``count`` tokens that ``seed`` always maps to."""
    return random_tokens(random.Random(seed), count, vocab)


def poisson_arrivals(rng: random.Random, count: int, rate_per_s: float) -> list[float]:
    """Arrival times of a Poisson process; all zero when ``rate_per_s`` is infinite."""
    if rate_per_s == float("inf"):
        return [0.0] * count
    now = 0.0
    times = []
    for _ in range(count):
        now += rng.expovariate(rate_per_s)
        times.append(now)
    return times
