"""One /metrics for several workers: their Prometheus expositions merged sample by sample.

How a sample combines depends on what it counts:
- counters and histograms of requests (buckets, sums, counts) add up: each request is seen by
  one worker;
- gauges of load a worker holds (in flight, queued, reserved KV) add up;
- state every worker keeps its own copy of (the prefix index built from the same KV events,
  KV-event counters, event-loop lag) takes the largest: adding copies would count them N times;
- per-worker opinions (a replica's health, its circuit state, prediction quality, whether Redis
  answers) take the mean: 0.5 for ``kvgate_backend_healthy`` means half the workers see the
  replica healthy;
- ``*_created`` timestamps take the earliest.
A metric not named below is summed, which is right for the request and load metrics.
"""

from collections.abc import Callable, Iterable, Iterator
from statistics import fmean

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

Combine = Callable[[list[float]], float]

LARGEST: frozenset[str] = frozenset(
    {
        "kvgate_prefix_index_blocks",
        "kvgate_prefix_index_bytes",
        "kvgate_prefix_index_evictions",
        "kvgate_prefix_index_replica_blocks",
        "kvgate_kv_event_batches",
        "kvgate_kv_event_lost_batches",
        "kvgate_kv_event_lag_seconds",
        "kvgate_event_loop_lag_max_seconds",
        "kvgate_pool_saturation",
    }
)
MEAN: frozenset[str] = frozenset(
    {
        "kvgate_backend_healthy",
        "kvgate_backend_circuit_state",
        "kvgate_prediction_exact_ratio",
        "kvgate_prediction_mean_abs_error_tokens",
        "kvgate_shared_state_up",
        "kvgate_worker_limits_up",
    }
)


def combine_rule(family: str) -> Combine:
    if family.endswith("_created"):
        return min
    if family in LARGEST:
        return max
    if family in MEAN:
        return fmean
    return sum


def merge_expositions(expositions: Iterable[bytes]) -> bytes:
    """One exposition (Prometheus text format) holding every family of ``expositions``, combined."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple, list[float]]] = {}
    for exposition in expositions:
        for family in text_string_to_metric_families(exposition.decode()):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            by_sample = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                by_sample.setdefault(key, []).append(sample.value)
    for name, family in families.items():
        combine = combine_rule(name)
        for (sample_name, labels), seen in values[name].items():
            family.samples.append(Sample(sample_name, dict(labels), combine(seen)))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)
