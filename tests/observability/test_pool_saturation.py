"""``kvgate_pool_saturation``: llm-d's roofline (queue depth, KV usage) per replica, capped at 1, averaged per model."""

import time

import pytest

from gateway.backends.pool import Backend, BackendPool
from gateway.config import BackendSpec, HealthConfig
from gateway.observability.saturation import (
    KV_CACHE_UTIL_THRESHOLD,
    QUEUE_DEPTH_THRESHOLD,
    ReplicaReading,
    pool_saturation,
    replica_saturation,
    saturation_by_model,
)
from protocol.replica_stats import ReplicaLoad


@pytest.mark.parametrize(
    ("waiting", "kv_usage", "expected"),
    [
        (0, 0.0, 0.0),
        (0, None, 0.0),
        (1, 0.0, 1 / QUEUE_DEPTH_THRESHOLD),
        (0, 0.4, 0.4 / KV_CACHE_UTIL_THRESHOLD),
        (2, 0.6, max(2 / QUEUE_DEPTH_THRESHOLD, 0.6 / KV_CACHE_UTIL_THRESHOLD)),
        (QUEUE_DEPTH_THRESHOLD, 0.1, 1.0),
        (4 * QUEUE_DEPTH_THRESHOLD, 0.1, 1.0),
        (0, 0.95, 1.0),
    ],
)
def test_a_replica_is_as_saturated_as_its_most_constrained_resource(
    waiting: int, kv_usage: float | None, expected: float
) -> None:
    assert replica_saturation(ReplicaReading(waiting, kv_usage, fresh=True)) == pytest.approx(expected)


def test_a_replica_without_a_fresh_report_counts_as_saturated_and_so_does_an_empty_pool() -> None:
    assert replica_saturation(ReplicaReading(0, 0.0, fresh=False)) == 1.0
    assert pool_saturation([]) == 1.0


def test_the_pool_is_the_mean_so_one_overloaded_replica_cannot_hide_idle_ones() -> None:
    idle, overloaded = ReplicaReading(0, 0.0, True), ReplicaReading(50, 1.0, True)
    assert pool_saturation([idle, overloaded]) == 0.5
    assert pool_saturation([idle, idle, idle, overloaded]) == 0.25


def backend(name: str, model: str, *, drain: bool = False) -> Backend:
    return BackendPool.from_specs(
        [(BackendSpec(name=name, url="http://127.0.0.1:1", drain=drain), model)], HealthConfig()
    ).backends[name]


def reported(target: Backend, waiting: int, kv_usage: float) -> Backend:
    target.healthy = True
    target.load.on_report(ReplicaLoad(ts=time.time(), running=4, waiting=waiting, kv_cache_usage=kv_usage))
    return target


def test_saturation_by_model_reads_reports_and_held_requests_over_usable_replicas_only() -> None:
    pool = BackendPool(
        [
            reported(backend("a1", "a"), waiting=0, kv_usage=0.4),
            reported(backend("a2", "a"), waiting=1, kv_usage=0.0),
            reported(backend("a3", "a", drain=True), waiting=50, kv_usage=1.0),
            reported(backend("b1", "b"), waiting=0, kv_usage=0.0),
            backend("b2", "b"),
            backend("c1", "c"),
        ],
        HealthConfig(),
    )
    saturation = saturation_by_model(pool, {"a2": 2})
    assert saturation["a"] == pytest.approx((0.4 / KV_CACHE_UTIL_THRESHOLD + 3 / QUEUE_DEPTH_THRESHOLD) / 2)
    assert saturation["b"] == 0.0, "b2 is not healthy yet (starting): left out"
    assert saturation["c"] == 1.0, "no usable replica: nothing can take the model's load"


def test_a_stale_report_counts_as_saturated() -> None:
    replica = reported(backend("r", "m"), waiting=0, kv_usage=0.0)
    pool = BackendPool([replica], HealthConfig())
    assert saturation_by_model(pool, {}) == {"m": 0.0}
    replica.load.report_received_at -= replica.load.stale_after_s + 1
    assert saturation_by_model(pool, {}) == {"m": 1.0}
