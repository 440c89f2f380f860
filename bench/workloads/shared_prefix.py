"""Generated shared prefix, after SGLang's ``generated-shared-prefix`` benchmark.

``num_groups`` groups each own a system prompt of ``system_prompt_len`` tokens; every group sends
``prompts_per_group`` prompts made of its system prompt plus a fresh question of
``question_len`` tokens. All prompts are shuffled together and arrive as a Poisson process.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workloads.token_blocks import DEFAULT_VOCAB, poisson_arrivals, random_tokens
from bench.workloads.types import BenchRequest


@dataclass(frozen=True)
class SharedPrefixParams:
    num_groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 16
    request_rate: float = 24.0
    """Requests per second (Poisson); inf sends everything at once."""
    seed: int = 0


def generate(params: SharedPrefixParams, vocab: Sequence[int] = DEFAULT_VOCAB) -> list[BenchRequest]:
    rng = random.Random(params.seed)
    prefixes = [random_tokens(rng, params.system_prompt_len, vocab) for _ in range(params.num_groups)]
    prompts = [
        (group, prefixes[group] + random_tokens(rng, params.question_len, vocab))
        for group in range(params.num_groups)
        for _ in range(params.prompts_per_group)
    ]
    rng.shuffle(prompts)
    arrivals = poisson_arrivals(rng, len(prompts), params.request_rate)
    return [
        BenchRequest(
            request_id=f"sp-{index}",
            session_id=f"sp-{index}",
            arrival_s=arrival,
            max_tokens=params.output_len,
            prompt_ids=prompt,
            user=f"group-{group}",
            group=f"group-{group}",
        )
        for index, ((group, prompt), arrival) in enumerate(zip(prompts, arrivals, strict=False))
    ]
