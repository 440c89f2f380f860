"""The dashboard's statistics of several workers as one: rolling windows merged bucket by bucket.

Windows are merged from their raw sums and TTFT samples (not from their summaries), so hit
rates stay token-weighted and percentiles come from the pooled samples.
"""

import dataclasses

from gateway.observability.rolling_stats import Bucket, Normalization, PrefillLegs, StatsWindow, Tally


def merge_windows(windows: list[StatsWindow]) -> StatsWindow:
    """A window holding every request of ``windows`` (all share the first one's bucket width)."""
    first = windows[0]
    merged = StatsWindow(first.bucket_s, first.bucket_s * (first.buckets.maxlen or 1))
    buckets: dict[int, Bucket] = {}
    for window in windows:
        _add_tally(merged.totals, window.totals)
        _add_tallies(merged.by_backend, window.by_backend)
        _add_tallies(merged.by_tenant, window.by_tenant)
        merged.reasons.update(window.reasons)
        for rule, entry in window.normalization.items():
            total = merged.normalization.setdefault(rule, Normalization())
            total.requests += entry.requests
            total.cached_tokens += entry.cached_tokens
        merged.pd.update(window.pd)
        for name, legs in window.prefill_legs.items():
            merged_legs = merged.prefill_legs.setdefault(name, PrefillLegs())
            merged_legs.legs += legs.legs
            merged_legs.prompt_tokens += legs.prompt_tokens
            merged_legs.cached_tokens += legs.cached_tokens
        for bucket in window.buckets:
            _add_bucket(buckets.setdefault(bucket.index, Bucket(bucket.index)), bucket)
    merged.buckets.extend(buckets[index] for index in sorted(buckets))
    return merged


def merge_breaker_tables(tables: list[list[dict]], limit: int = 20) -> list[dict]:
    """Prefix-breaker rows of several workers; rows of one (model, position) become one."""
    rows: dict[tuple[str, int], dict] = {}
    for table in tables:
        for row in table:
            key = (row["model"], row["position"])
            if key not in rows:
                rows[key] = dict(row)
                continue
            seen = rows[key]
            lost = seen["mean_lost_tokens"] * seen["requests"] + row["mean_lost_tokens"] * row["requests"]
            seen["requests"] += row["requests"]
            seen["mean_lost_tokens"] = round(lost / seen["requests"], 1)
            seen["last_seen"] = max(seen["last_seen"], row["last_seen"])
    ranked = sorted(rows.values(), key=lambda row: row["requests"] * row["mean_lost_tokens"], reverse=True)
    return ranked[:limit]


def _add_tally(total: Tally, part: Tally) -> None:
    for field in dataclasses.fields(Tally):
        setattr(total, field.name, getattr(total, field.name) + getattr(part, field.name))


def _add_tallies(totals: dict[str, Tally], parts: dict[str, Tally]) -> None:
    for name, part in parts.items():
        _add_tally(totals.setdefault(name, Tally()), part)


def _add_bucket(total: Bucket, part: Bucket) -> None:
    _add_tally(total.overall, part.overall)
    _add_tallies(total.by_backend, part.by_backend)
    total.reasons.update(part.reasons)
    total.ttft_samples.extend(part.ttft_samples)
    total.ttft_seen += part.ttft_seen
