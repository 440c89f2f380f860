"""Where each router sent a hotspot burst (``bench/workloads/hotspot_burst.py``): the burst's
requests per replica, and their TTFT, per contender."""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from bench.harness.loadgen import LoadResult
from bench.workloads.hotspot_burst import BURST_GROUP


@dataclass(frozen=True)
class BurstPlacement:
    contender: str
    per_replica: dict[str, int]
    """Burst requests each of the contender's replicas was sent (every one it named in its run, in
    name order; empty where the router names none, as sglang-router's answers do not)."""
    ttft_p50_s: float
    ttft_p99_s: float
    hit_rate: float


def burst_placements(loads: Mapping[str, LoadResult]) -> list[BurstPlacement]:
    """One row per contender whose run held burst requests. Each contender's replicas are those its
    own run names: in ``bench run`` every contender gets fresh replicas at other addresses."""
    rows = []
    for name, load in loads.items():
        burst = [result for result in load.results if result.group == BURST_GROUP]
        if not burst:
            continue
        replicas = sorted(
            {result.backend for result in load.results if result.backend is not None},
            key=lambda replica: (len(replica), replica),
        )
        counts = Counter(result.backend for result in burst if result.backend is not None)
        ttfts = [result.ttft for result in burst if result.ok]
        prompt = sum(result.prompt_tokens for result in burst if result.ok)
        rows.append(
            BurstPlacement(
                contender=name,
                per_replica={replica: counts.get(replica, 0) for replica in replicas},
                ttft_p50_s=float(np.percentile(ttfts, 50)) if ttfts else float("nan"),
                ttft_p99_s=float(np.percentile(ttfts, 99)) if ttfts else float("nan"),
                hit_rate=sum(result.cached_tokens for result in burst if result.ok) / prompt if prompt else 0.0,
            )
        )
    return rows


def burst_markdown(rows: list[BurstPlacement]) -> str:
    if not rows:
        return ""
    lines = [
        "The burst (requests per replica; its TTFT and hit rate):",
        "",
        "| contender | burst per replica | max / mean | TTFT p50 (s) | TTFT p99 (s) | burst hit rate |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        counts = list(row.per_replica.values())
        mean = sum(counts) / len(counts) if counts else 0.0
        placed = " / ".join(str(count) for count in counts) if counts else "not reported by the router"
        spread = f"{max(counts) / mean:.2f}" if mean else "–"
        lines.append(
            f"| {row.contender} | {placed} | {spread} "
            f"| {row.ttft_p50_s:.3f} | {row.ttft_p99_s:.3f} | {row.hit_rate:.1%} |"
        )
    return "\n".join(lines)
