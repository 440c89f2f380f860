"""Hot-prefix skew: one group sends ``hot_fraction`` of all requests, the others share the rest.

Shaped like the shared-prefix workload (a group system prompt plus a fresh question), at a
request rate where the hot group alone is more than one replica can serve, so a router that
pins each prefix to one replica melts that replica down.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workloads.token_blocks import DEFAULT_VOCAB, poisson_arrivals, random_tokens
from bench.workloads.types import BenchRequest


@dataclass(frozen=True)
class SkewParams:
    num_groups: int = 32
    num_requests: int = 1200
    hot_fraction: float = 0.5
    system_prompt_len: int = 2048
    question_len: int = 512
    output_len: int = 16
    request_rate: float = 40.0
    seed: int = 0


def generate(params: SkewParams, vocab: Sequence[int] = DEFAULT_VOCAB) -> list[BenchRequest]:
    rng = random.Random(params.seed)
    prefixes = [random_tokens(rng, params.system_prompt_len, vocab) for _ in range(params.num_groups)]
    cold_weight = (1.0 - params.hot_fraction) / max(params.num_groups - 1, 1)
    weights = [params.hot_fraction] + [cold_weight] * (params.num_groups - 1)
    groups = rng.choices(range(params.num_groups), weights=weights, k=params.num_requests)
    arrivals = poisson_arrivals(rng, params.num_requests, params.request_rate)
    return [
        BenchRequest(
            request_id=f"skew-{index}",
            session_id=f"skew-{index}",
            arrival_s=arrival,
            max_tokens=params.output_len,
            prompt_ids=prefixes[group] + random_tokens(rng, params.question_len, vocab),
            user=f"group-{group}",
            group=f"group-{group}",
        )
        for index, (group, arrival) in enumerate(zip(groups, arrivals, strict=False))
    ]
