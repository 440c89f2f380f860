"""Hotspot burst: many requests carrying one new system prompt arrive at the same instant.

Every router's users report this one (vllm-project/production-stack#957; llm-d-router PR #2515,
where stale in-flight counts sent a whole burst to one pod): a prompt nobody holds yet, so the
first request's placement decides where the prefix will live, and the rest arrive before any
KV event or load report says where that is. A background of shared-prefix traffic (a few
system prompts at a steady Poisson rate) keeps the replicas' caches and queues warm before and
after the burst. Burst requests are in group ``burst``; ``bench/harness/burst_report.py`` reports where
each router sent them.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workloads.token_blocks import DEFAULT_VOCAB, poisson_arrivals, random_tokens
from bench.workloads.types import BenchRequest

BURST_GROUP = "burst"


@dataclass(frozen=True)
class HotspotBurstParams:
    burst_size: int = 64
    burst_at_s: float = 10.0
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 32
    background_groups: int = 8
    background_rate: float = 8.0
    """Background requests per second (Poisson) from the start for ``duration_s``."""
    duration_s: float = 20.0
    seed: int = 0


def generate(params: HotspotBurstParams, vocab: Sequence[int] = DEFAULT_VOCAB) -> list[BenchRequest]:
    rng = random.Random(params.seed)
    background_prefixes = [random_tokens(rng, params.system_prompt_len, vocab) for _ in range(params.background_groups)]
    burst_prefix = random_tokens(rng, params.system_prompt_len, vocab)
    arrivals = [
        arrival
        for arrival in poisson_arrivals(
            rng, int(params.background_rate * params.duration_s * 2), params.background_rate
        )
        if arrival < params.duration_s
    ]
    requests = []
    for index, arrival in enumerate(arrivals):
        group = rng.randrange(params.background_groups)
        requests.append(
            BenchRequest(
                request_id=f"bg-{index}",
                session_id=f"bg-{index}",
                arrival_s=arrival,
                max_tokens=params.output_len,
                prompt_ids=background_prefixes[group] + random_tokens(rng, params.question_len, vocab),
                user=f"group-{group}",
                group=f"group-{group}",
            )
        )
    for index in range(params.burst_size):
        requests.append(
            BenchRequest(
                request_id=f"burst-{index}",
                session_id=f"burst-{index}",
                arrival_s=params.burst_at_s,
                max_tokens=params.output_len,
                prompt_ids=burst_prefix + random_tokens(rng, params.question_len, vocab),
                user=BURST_GROUP,
                group=BURST_GROUP,
            )
        )
    return sorted(requests, key=lambda request: request.arrival_s)
