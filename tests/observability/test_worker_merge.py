"""Merging the state of several gateway workers: Prometheus expositions and dashboard windows."""

import re

from gateway.observability.metrics import GatewayMetrics
from gateway.observability.metrics_merge import merge_expositions
from gateway.observability.rolling_stats import StatsWindow
from gateway.observability.stats_merge import merge_breaker_tables, merge_windows
from gateway.observability.telemetry_record import RequestRecord


def _value(exposition: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", exposition, re.M)
    assert match is not None, f"{sample} missing from:\n{exposition}"
    return float(match.group(1))


def _gauges(in_flight: int, healthy: int, index_blocks: int) -> bytes:
    return (
        "# TYPE kvgate_backend_in_flight gauge\n"
        f'kvgate_backend_in_flight{{backend="a"}} {in_flight}\n'
        "# TYPE kvgate_backend_healthy gauge\n"
        f'kvgate_backend_healthy{{backend="a"}} {healthy}\n'
        "# TYPE kvgate_prefix_index_blocks gauge\n"
        f"kvgate_prefix_index_blocks {index_blocks}\n"
    ).encode()


def test_counters_and_histograms_add_up() -> None:
    workers = [GatewayMetrics(), GatewayMetrics()]
    for count, metrics in enumerate(workers, start=1):
        for _ in range(count):
            metrics.requests.labels("m", "a", "t", "200").inc()
            metrics.e2e.labels("m", "a").observe(0.02 * count)
    merged = merge_expositions(metrics.exposition() for metrics in workers).decode()
    labels = 'backend="a",model="m",status="200",tenant="t"'
    assert _value(merged, f"kvgate_requests_total{{{labels}}}") == 3
    assert _value(merged, 'kvgate_e2e_request_latency_seconds_count{backend="a",model="m"}') == 3
    assert _value(merged, 'kvgate_e2e_request_latency_seconds_bucket{backend="a",le="0.025",model="m"}') == 1
    assert _value(merged, 'kvgate_e2e_request_latency_seconds_bucket{backend="a",le="0.05",model="m"}') == 3


def test_load_adds_replicated_state_takes_the_largest_opinions_the_mean() -> None:
    merged = merge_expositions([_gauges(3, 1, 100), _gauges(2, 0, 90)]).decode()
    assert _value(merged, 'kvgate_backend_in_flight{backend="a"}') == 5
    assert _value(merged, "kvgate_prefix_index_blocks") == 100
    assert _value(merged, 'kvgate_backend_healthy{backend="a"}') == 0.5


def _record(backend: str, prompt: int, cached: int, ttft_s: float, at: float) -> RequestRecord:
    return RequestRecord(
        request_id="r",
        model="m",
        tenant="t",
        status="200",
        backend=backend,
        reason="prefix-hit",
        prompt_tokens=prompt,
        cached_tokens=cached,
        ttft_s=ttft_s,
        e2e_s=ttft_s,
        finished_at=at,
    )


def test_windows_merge_from_raw_sums_and_pooled_samples() -> None:
    first, second = StatsWindow(5.0, 60.0), StatsWindow(5.0, 60.0)
    first.add(_record("a", 100, 90, 0.1, 1000.0))
    second.add(_record("b", 300, 0, 0.3, 1000.0))
    second.add(_record("b", 100, 50, 0.5, 1006.0))
    merged = merge_windows([first, second])
    summary = merged.totals.summary()
    assert (summary["requests"], summary["prompt_tokens"], summary["cached_tokens"]) == (3, 500, 140)
    assert summary["hit_rate"] == 140 / 500
    series = merged.series(now=1006.0)
    assert series["requests_per_s"] == [2 / 5.0, 1 / 5.0]
    assert series["hit_rate"] == [90 / 400, 50 / 100]
    assert series["ttft_p99_s"][0] > 0.29
    assert set(merged.by_backend) == {"a", "b"}


def test_breaker_rows_of_one_position_become_one() -> None:
    row = {"model": "m", "position": 7, "block": 0, "preview": "x", "last_seen": 1.0}
    merged = merge_breaker_tables(
        [[{**row, "requests": 1, "mean_lost_tokens": 100.0}], [{**row, "requests": 3, "mean_lost_tokens": 20.0}]]
    )
    assert len(merged) == 1
    assert (merged[0]["requests"], merged[0]["mean_lost_tokens"]) == (4, 40.0)
