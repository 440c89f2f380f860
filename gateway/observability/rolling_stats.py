"""Rolling statistics behind the dashboard: fixed-width time buckets plus totals since start.

Each request is added once, when it finishes; memory is bounded by the window (buckets) and a
reservoir of TTFT samples per bucket for the percentiles.
"""

import math
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from gateway.observability.telemetry_record import RequestRecord

TTFT_SAMPLES_PER_BUCKET = 1024


@dataclass
class Tally:
    """Sums over a set of requests; hit rates are token-weighted."""

    requests: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    predicted_cached_tokens: int = 0
    cached_tokens: int = 0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    cost: float = 0.0
    """At ``observability.pricing`` (gateway/observability/pricing.py); 0 without prices."""
    cache_savings: float = 0.0

    def add(self, record: RequestRecord) -> None:
        if record.rejected:
            self.rejected += 1
            return
        self.requests += 1
        self.prompt_tokens += record.prompt_tokens
        self.predicted_cached_tokens += record.predicted_cached_tokens
        self.cached_tokens += record.cached_tokens or 0
        self.cost += record.cost or 0.0
        self.cache_savings += record.cache_savings or 0.0
        if record.ttft_s is not None:
            self.ttft_sum_s += record.ttft_s
            self.ttft_count += 1

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "rejected": self.rejected,
            "prompt_tokens": self.prompt_tokens,
            "predicted_cached_tokens": self.predicted_cached_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": _ratio(self.cached_tokens, self.prompt_tokens),
            "predicted_hit_rate": _ratio(self.predicted_cached_tokens, self.prompt_tokens),
            "mean_ttft_s": _ratio(self.ttft_sum_s, self.ttft_count),
            "cost": self.cost,
            "cache_savings": self.cache_savings,
        }


@dataclass
class Bucket:
    index: int
    """Bucket number since the epoch: start time // bucket width."""
    overall: Tally = field(default_factory=Tally)
    by_backend: dict[str, Tally] = field(default_factory=dict)
    reasons: Counter = field(default_factory=Counter)
    ttft_samples: list[float] = field(default_factory=list)
    ttft_seen: int = 0

    def add(self, record: RequestRecord) -> None:
        self.overall.add(record)
        if record.backend is None:
            return
        _tally(self.by_backend, record.backend).add(record)
        self.reasons[record.reason] += 1
        if record.ttft_s is not None:
            self._sample_ttft(record.ttft_s)

    def _sample_ttft(self, ttft_s: float) -> None:
        """Reservoir sampling, so a busy bucket keeps a fair sample in bounded memory."""
        self.ttft_seen += 1
        if len(self.ttft_samples) < TTFT_SAMPLES_PER_BUCKET:
            self.ttft_samples.append(ttft_s)
            return
        slot = random.randrange(self.ttft_seen)
        if slot < TTFT_SAMPLES_PER_BUCKET:
            self.ttft_samples[slot] = ttft_s


@dataclass
class Normalization:
    requests: int = 0
    cached_tokens: int = 0


@dataclass
class PrefillLegs:
    """Prefill legs a replica served for disaggregated requests, and its prefix hits on them."""

    legs: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


class StatsWindow:
    """Time series over the last `window_s` seconds in `bucket_s` steps, and totals since start."""

    def __init__(self, bucket_s: float, window_s: float) -> None:
        self.bucket_s = bucket_s
        self.window_buckets = max(1, math.ceil(window_s / bucket_s))
        self.buckets: deque[Bucket] = deque(maxlen=self.window_buckets)
        self.totals = Tally()
        self.by_backend: dict[str, Tally] = {}
        self.by_tenant: dict[str, Tally] = {}
        self.reasons: Counter = Counter()
        self.normalization: dict[str, Normalization] = {}
        self.pd: Counter = Counter()
        """Requests to models with P/D roles, by where their prefill ran."""
        self.prefill_legs: dict[str, PrefillLegs] = {}

    def add(self, record: RequestRecord) -> None:
        self._bucket(record.finished_at).add(record)
        self.totals.add(record)
        _tally(self.by_tenant, record.tenant).add(record)
        self._add_pd(record)
        if record.backend is None:
            return
        _tally(self.by_backend, record.backend).add(record)
        self.reasons[record.reason] += 1
        for rule in record.normalized_rules:
            normalization = self.normalization.setdefault(rule, Normalization())
            normalization.requests += 1
            normalization.cached_tokens += record.cached_tokens or 0

    def _add_pd(self, record: RequestRecord) -> None:
        if record.pd is not None:
            self.pd[record.pd] += 1
        if record.prefill_backend is not None:
            legs = self.prefill_legs.setdefault(record.prefill_backend, PrefillLegs())
            legs.legs += 1
            legs.prompt_tokens += record.prefill_prompt_tokens or 0
            legs.cached_tokens += record.prefill_cached_tokens or 0

    def _bucket(self, at: float) -> Bucket:
        """The newest bucket, opened if ``at`` is past it: records arrive as requests finish, in time
        order, so only the newest bucket grows (a wall-clock step back also lands there)."""
        index = int(at // self.bucket_s)
        if not self.buckets or self.buckets[-1].index < index:
            self.buckets.append(Bucket(index))
        return self.buckets[-1]

    def series(self, now: float | None = None) -> dict:
        """One point per bucket, oldest first, gaps filled, up to the bucket holding ``now``."""
        last = int((time.time() if now is None else now) // self.bucket_s)
        by_index = {bucket.index: bucket for bucket in self.buckets if bucket.index > last - self.window_buckets}
        first = min(by_index, default=last)
        points = [by_index.get(index) or Bucket(index) for index in range(first, last + 1)]
        backends = sorted({name for bucket in points for name in bucket.by_backend})
        return {
            "t": [bucket.index * self.bucket_s for bucket in points],
            "requests_per_s": [bucket.overall.requests / self.bucket_s for bucket in points],
            "cached_tokens_per_s": [bucket.overall.cached_tokens / self.bucket_s for bucket in points],
            "hit_rate": [_ratio(b.overall.cached_tokens, b.overall.prompt_tokens) for b in points],
            "predicted_hit_rate": [_ratio(b.overall.predicted_cached_tokens, b.overall.prompt_tokens) for b in points],
            "ttft_p50_s": [_percentile(bucket.ttft_samples, 50) for bucket in points],
            "ttft_p99_s": [_percentile(bucket.ttft_samples, 99) for bucket in points],
            "by_backend": {name: _backend_series(points, name, self.bucket_s) for name in backends},
            "reasons": _reason_series(points),
        }


def _backend_series(points: list[Bucket], name: str, bucket_s: float) -> dict:
    tallies = [bucket.by_backend.get(name) or Tally() for bucket in points]
    return {
        "requests_per_s": [tally.requests / bucket_s for tally in tallies],
        "hit_rate": [_ratio(tally.cached_tokens, tally.prompt_tokens) for tally in tallies],
        "predicted_hit_rate": [_ratio(tally.predicted_cached_tokens, tally.prompt_tokens) for tally in tallies],
    }


def _reason_series(points: list[Bucket]) -> dict[str, list[int]]:
    reasons = sorted({reason for bucket in points for reason in bucket.reasons})
    return {reason: [bucket.reasons.get(reason, 0) for bucket in points] for reason in reasons}


def _tally(tallies: dict[str, Tally], name: str) -> Tally:
    """``tallies[name]``, created when missing (``setdefault`` would build a Tally every call)."""
    tally = tallies.get(name)
    if tally is None:
        tally = tallies[name] = Tally()
    return tally


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _percentile(samples: list[float], q: float) -> float | None:
    return float(np.percentile(samples, q)) if samples else None
