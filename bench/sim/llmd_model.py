"""A model of llm-d's precise prefix-cache scheduling, for ``bench simulate --peers``.

The ``precise-prefix-cache-aware`` guide (llm-d/llm-d, ``guides/precise-prefix-cache-aware/scheduler/
precise-prefix-cache-aware.values.yaml``) runs three weighted scorers (2, 1, 1) and a max-score
picker, without speculative indexing; written from llm-d-inference-scheduler's source (``pkg/epp/framework/plugins/
scheduling/``, commit 520af47, 2026-05-17) and llm-d-kv-cache's ``pkg/kvcache/kvblock_scorer.go``:

- **Prefix (weight 2).** ``LongestPrefixScorer``: for each pod, the run of the request's blocks,
  from block 0, that the KV-event index says it holds (pods without block 0 are absent from the
  result). ``scorer/preciseprefixcache/utils.go`` then normalises. Since llm-d-inference-scheduler
  #1107 (2026-05-14, ``absoluteScoredPods``): ``matched / total request blocks``, clipped to
  [0, 1] (``normalization="absolute"``, the default here). Before it, and as the guide and
  PEERS.md describe (``indexedScoresToNormalizedScoredPods``): min-max over the pods that hold
  block 0, 1.0 for each of them when they all match equally, 0 for pods that hold nothing
  (``normalization="min-max"``). Speculative indexing (``PreRequest``) is off by default.
- **KV utilisation (weight 1).** ``scorer/kvcacheutilization``: ``1 - KVCacheUsagePercent``.
- **Queue (weight 1).** ``scorer/queuedepth/queue.go``: ``(max_q - q) / (max_q - min_q)`` over
  the waiting-queue sizes, 1.0 for every pod when they are all equal.
- **Picker.** ``picker/maxscore/picker.go``: shuffles the endpoints, then a stable sort by score,
  so ties go to a uniformly random pod among the best (seeded here, so runs repeat).

Usage and queue are the pods' scraped metrics: the endpoint picker refreshes them every 50 ms
(``RefreshMetricsInterval``, ``pkg/epp/server/options.go``), so a burst that arrives within one
interval is scored on the same numbers. ``observe`` is that scrape.
"""

import random
from dataclasses import dataclass, field
from typing import Literal

from bench.sim.peer_kv_index import PeerKVIndex
from radix.hashing import BlockHash

METRICS_REFRESH_S = 0.05
"""The endpoint picker's metrics refresh interval (its default)."""


@dataclass(frozen=True)
class PodMetrics:
    waiting: int = 0
    kv_usage: float = 0.0


@dataclass
class LlmdPrecisePrefix:
    replicas: list[str]
    index: PeerKVIndex
    seed: int = 0
    prefix_weight: float = 2.0
    kv_utilization_weight: float = 1.0
    queue_weight: float = 1.0
    normalization: Literal["absolute", "min-max"] = "absolute"
    metrics_refresh_s: float = METRICS_REFRESH_S
    metrics: dict[str, PodMetrics] = field(init=False)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = dict.fromkeys(self.replicas, PodMetrics())
        self._rng = random.Random(self.seed)

    def observe(self, replica: str, waiting: int, kv_usage: float) -> None:
        """One metrics scrape of a pod."""
        self.metrics[replica] = PodMetrics(waiting, kv_usage)

    def prefix_scores(self, block_hashes: list[BlockHash]) -> dict[str, float]:
        matched = self.index.prefix_blocks(block_hashes)
        if self.normalization == "absolute":
            total = len(block_hashes)
            return {name: min(count / total, 1.0) if total else 0.0 for name, count in matched.items()}
        holders = {name: count for name, count in matched.items() if count > 0}
        if not holders:
            return dict.fromkeys(self.replicas, 0.0)
        low, high = min(holders.values()), max(holders.values())
        return {
            name: (1.0 if high == low else (holders[name] - low) / (high - low)) if name in holders else 0.0
            for name in self.replicas
        }

    def queue_scores(self) -> dict[str, float]:
        waiting = {name: self.metrics[name].waiting for name in self.replicas}
        low, high = min(waiting.values()), max(waiting.values())
        return {name: 1.0 if high == low else (high - queue) / (high - low) for name, queue in waiting.items()}

    def scores(self, block_hashes: list[BlockHash]) -> dict[str, float]:
        prefix, queue = self.prefix_scores(block_hashes), self.queue_scores()
        return {
            name: self.prefix_weight * prefix[name]
            + self.kv_utilization_weight * (1.0 - self.metrics[name].kv_usage)
            + self.queue_weight * queue[name]
            for name in self.replicas
        }

    def route(self, request_id: str, block_hashes: list[BlockHash], prompt_tokens: int) -> tuple[str, str]:
        """The pod with the highest weighted score; ties at random."""
        scores = self.scores(block_hashes)
        best = max(scores.values())
        tied = [name for name in self.replicas if scores[name] == best]
        chosen = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        return chosen, "max-score" if len(tied) == 1 else "max-score-tie"

    def first_token(self, request_id: str) -> None:
        """Nothing: the scheduler keeps no per-request state (speculative indexing off)."""

    def finished(self, request_id: str) -> None:
        """Nothing: load is read from the pods' metrics."""
