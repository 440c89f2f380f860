"""Sequences for block-manager and scheduler tests, built in one place."""

from engine.core.sequence import Sequence
from engine.model.lora_modules import LoRARef
from engine.model.runner_api import SamplingParams


def synthetic_prompt(seq_id: int, length: int) -> list[int]:
    """``length`` token ids from a small vocabulary, different for each ``seq_id``."""
    return [(seq_id * 7 + i) % 50 for i in range(length)]


def make_seq(
    seq_id: int,
    prompt: list[int] | int,
    max_tokens: int = 4,
    *,
    max_total_tokens: int = 256,
    salt: str | None = None,
    session: str | None = None,
    adapter: LoRARef | None = None,
) -> Sequence:
    """A greedy sequence of ``prompt``: its token ids, or a length for a ``synthetic_prompt``."""
    tokens = synthetic_prompt(seq_id, prompt) if isinstance(prompt, int) else prompt
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return Sequence(
        seq_id, tokens, sampling, max_total_tokens=max_total_tokens, cache_salt=salt, session=session, adapter=adapter
    )
