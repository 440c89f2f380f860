"""How saturated each model's pool of replicas is, 0 to 1: the gateway's autoscaling signal.

Defined as llm-d's utilization saturation detector defines it (llm-d-inference-scheduler,
``pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization``), a roofline over the two
resources a replica runs out of:

    replica = min(1, max(waiting / QUEUE_DEPTH_THRESHOLD, kv_usage / KV_CACHE_UTIL_THRESHOLD))
    pool    = mean(replica over the model's usable replicas)

- ``waiting``: requests queued at the replica (its latest load report, plus this gateway's requests
  sent since) and requests this gateway holds for it (late binding). A queue means the batch is
  full: each waiting request adds its whole time-to-first-token of delay.
- ``kv_usage``: the fraction of the replica's KV blocks held by requests. Past ~80 % the engine
  starts to preempt and to evict prefixes that later requests would have hit.
- A usable replica (healthy, breaker closed, not draining) without a fresh load report counts as
  saturated (1), as llm-d counts a replica with stale metrics: it takes requests the gateway cannot
  see queue. With no usable replica at all the pool is saturated (1).
- Replicas that are not usable (starting, failing, draining) are left out rather than counted as
  saturated: a pod that is still loading its model would otherwise read as full and make an
  autoscaler overshoot, and a lost replica's share shows up in the others' queues anyway.

Unlike llm-d's detector, each replica's score is capped at 1 before the mean, so the gauge stays
in 0..1 and one replica far past its threshold cannot hide idle ones: 0.5 means half the pool's
capacity is in use by that measure, whichever replicas hold it. An autoscaler targets it directly
(scale out above ~0.7, in below ~0.3: ``deploy/autoscaling/``).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.backends.pool import Backend, BackendPool

QUEUE_DEPTH_THRESHOLD = 5
"""Waiting requests at which a replica counts as saturated (llm-d's default ``queueDepthThreshold``)."""
KV_CACHE_UTIL_THRESHOLD = 0.8
"""KV usage at which a replica counts as saturated (llm-d's default ``kvCacheUtilThreshold``)."""


@dataclass(frozen=True)
class ReplicaReading:
    """What the saturation of one replica is computed from."""

    waiting: int
    kv_usage: float | None
    """None when the replica does not report it (the queue alone decides)."""
    fresh: bool
    """Its latest load report is fresh; otherwise the replica counts as saturated."""


def replica_saturation(reading: ReplicaReading) -> float:
    if not reading.fresh:
        return 1.0
    queue = reading.waiting / QUEUE_DEPTH_THRESHOLD
    kv = (reading.kv_usage or 0.0) / KV_CACHE_UTIL_THRESHOLD
    return min(1.0, max(queue, kv, 0.0))


def pool_saturation(readings: Sequence[ReplicaReading]) -> float:
    """The mean replica saturation; 1 for no usable replica (nothing can serve the model)."""
    if not readings:
        return 1.0
    return sum(replica_saturation(reading) for reading in readings) / len(readings)


def reading_of(backend: Backend, held: int) -> ReplicaReading:
    """``held``: requests this gateway holds for the replica (late binding), waiting for it too."""
    load = backend.load
    report = load.report
    kv_usage = report.kv_cache_usage if report is not None else None
    return ReplicaReading(load.now().waiting + held, kv_usage, load.fresh)


def saturation_by_model(pool: BackendPool, held_by_owner: Mapping[str, int]) -> dict[str, float]:
    """Each served model's pool saturation, over its usable replicas."""
    readings: dict[str, list[ReplicaReading]] = {}
    for backend in list(pool.backends.values()):
        model_readings = readings.setdefault(backend.model, [])
        if backend.usable:
            model_readings.append(reading_of(backend, held_by_owner.get(backend.name, 0)))
    return {model: pool_saturation(model_readings) for model, model_readings in readings.items()}
