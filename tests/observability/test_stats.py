"""Dashboard statistics: token-weighted hit rates, gap-filled series, bounded window."""

from gateway.observability.rolling_stats import TTFT_SAMPLES_PER_BUCKET, StatsWindow
from gateway.observability.telemetry_record import RequestRecord


def served(
    at: float, backend: str, prompt: int, cached: int, predicted: int, ttft: float, **fields: object
) -> RequestRecord:
    return RequestRecord(
        request_id="r",
        model="m",
        backend=backend,
        reason="prefix-hit",
        prompt_tokens=prompt,
        cached_tokens=cached,
        predicted_cached_tokens=predicted,
        ttft_s=ttft,
        finished_at=at,
        **fields,
    )


def test_hit_rates_are_token_weighted_per_backend_and_overall() -> None:
    window = StatsWindow(bucket_s=5, window_s=60)
    window.add(served(100.0, "a", prompt=100, cached=90, predicted=80, ttft=0.1))
    window.add(served(101.0, "a", prompt=300, cached=0, predicted=0, ttft=0.3))
    window.add(served(102.0, "b", prompt=100, cached=50, predicted=50, ttft=0.2))
    assert window.totals.summary()["hit_rate"] == 140 / 500
    assert window.by_backend["a"].summary()["hit_rate"] == 90 / 400
    assert window.by_backend["a"].summary()["predicted_hit_rate"] == 80 / 400
    series = window.series(now=103.0)
    assert series["t"] == [100.0]
    assert series["hit_rate"] == [140 / 500]
    assert series["cached_tokens_per_s"] == [140 / 5]
    assert series["by_backend"]["b"]["hit_rate"] == [0.5]
    assert series["ttft_p50_s"] == [0.2]
    assert series["reasons"] == {"prefix-hit": [3]}


def test_series_fill_gaps_up_to_now_and_forget_old_buckets() -> None:
    window = StatsWindow(bucket_s=5, window_s=20)
    window.add(served(0.0, "a", prompt=10, cached=0, predicted=0, ttft=0.1))
    window.add(served(10.0, "a", prompt=10, cached=10, predicted=10, ttft=0.1))
    series = window.series(now=16.0)
    assert series["t"] == [0.0, 5.0, 10.0, 15.0]
    assert series["hit_rate"] == [0.0, None, 1.0, None]
    assert series["requests_per_s"] == [0.2, 0.0, 0.2, 0.0]
    later = window.series(now=41.0)
    assert later["t"] == [40.0]
    assert later["hit_rate"] == [None]
    assert window.totals.requests == 2


def test_rejections_count_per_tenant_but_not_as_traffic() -> None:
    window = StatsWindow(bucket_s=5, window_s=60)
    refused = RequestRecord(request_id="r", model=None, tenant="t1", status="429", error_code="queue_full")
    refused.finished_at = 1.0
    window.add(refused)
    window.add(served(2.0, "a", prompt=10, cached=5, predicted=5, ttft=0.1, tenant="t1", normalized_rules=["nfc"]))
    assert window.by_tenant["t1"].summary()["rejected"] == 1
    assert window.by_tenant["t1"].summary()["requests"] == 1
    assert window.totals.requests == 1
    assert window.normalization["nfc"].cached_tokens == 5
    assert "None" not in window.by_backend


def test_ttft_samples_per_bucket_are_bounded() -> None:
    window = StatsWindow(bucket_s=5, window_s=60)
    for index in range(3 * TTFT_SAMPLES_PER_BUCKET):
        window.add(served(100.0, "a", prompt=10, cached=0, predicted=0, ttft=index / (3 * TTFT_SAMPLES_PER_BUCKET)))
    assert len(window.buckets[-1].ttft_samples) == TTFT_SAMPLES_PER_BUCKET
    assert 0.35 < window.series(now=101.0)["ttft_p50_s"][0] < 0.65
