"""Gauges of the gateway's live state, read at scrape time: replicas, queue, prefix index, KV events."""

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from gateway.admission.queue import AdmissionQueue
from gateway.backends.circuit_breaker import BreakerState
from gateway.backends.pool import BackendPool
from gateway.observability.saturation import saturation_by_model
from gateway.routing.held_requests import HeldRequests
from gateway.routing.router import Router
from radix.kv_event_subscriber import SubscriberStats


def _gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


class LiveStateCollector(Collector):
    """Reads the parts on each scrape; a reload updates these parts in place, so they stay current."""

    def __init__(self, pool: BackendPool, router: Router, queue: AdmissionQueue, held: HeldRequests) -> None:
        self.pool = pool
        self.router = router
        self.queue = queue
        self.held = held

    def collect(self) -> Iterator[Metric]:
        yield from self._backends()
        yield from self._queue()
        yield from self._held()
        yield from self._router()
        yield self._saturation()

    def _backends(self) -> Iterator[Metric]:
        in_flight = _gauge("kvgate_backend_in_flight", "Requests in flight on a backend.", "backend")
        prefill = _gauge(
            "kvgate_backend_in_flight_prefill_tokens", "Uncached prompt tokens of requests in flight.", "backend"
        )
        kv_reserved = _gauge("kvgate_backend_kv_reserved_blocks", "KV blocks reserved by admitted requests.", "backend")
        healthy = _gauge("kvgate_backend_healthy", "1 when a backend passes its health checks.", "backend")
        circuit = _gauge("kvgate_backend_circuit_state", "1 for the circuit state a backend is in.", "backend", "state")
        restarts = _counter(
            "kvgate_backend_restarts", "Restarts a backend reported (a later process start time).", "backend"
        )
        for backend in list(self.pool.backends.values()):
            in_flight.add_metric([backend.name], backend.in_flight)
            prefill.add_metric([backend.name], backend.in_flight_prefill_tokens)
            kv_reserved.add_metric([backend.name], backend.kv_reserved_blocks)
            healthy.add_metric([backend.name], 1.0 if backend.healthy else 0.0)
            restarts.add_metric([backend.name], backend.restarts)
            current = backend.breaker.state
            for state in BreakerState:
                circuit.add_metric([backend.name, state.value], 1.0 if state is current else 0.0)
        yield from (in_flight, prefill, kv_reserved, healthy, circuit, restarts)

    def _queue(self) -> Iterator[Metric]:
        depth = _gauge("kvgate_queue_depth", "Requests waiting in the admission queue.", "tenant")
        for tenant, waiting in self.queue.waiting_by_tenant().items():
            depth.add_metric([tenant], waiting)
        yield depth

    def _held(self) -> Iterator[Metric]:
        stats = self.held.stats()
        held = _gauge("kvgate_late_binding_held", "Requests held at the gateway for their busy owner.", "backend")
        for owner, count in stats.held_by_owner.items():
            held.add_metric([owner], count)
        yield held
        left = _counter("kvgate_late_binding_left", "Held requests by how they left the hold.", "outcome")
        left.add_metric(["released"], stats.released)
        left.add_metric(["timed_out"], stats.timed_out)
        left.add_metric(["client_gone"], stats.gone)
        yield left
        yield SummaryMetricFamily(
            "kvgate_late_binding_wait_seconds",
            "Time requests spent held for their owner.",
            count_value=stats.left,
            sum_value=stats.wait_s_total,
        )

    def _saturation(self) -> Metric:
        saturation = _gauge(
            "kvgate_pool_saturation",
            "How saturated a model's replicas are, 0 to 1 (queue depth and KV usage; docs/deploy.md).",
            "model",
        )
        for model, value in saturation_by_model(self.pool, self.held.stats().held_by_owner).items():
            saturation.add_metric([model], value)
        return saturation

    def _router(self) -> Iterator[Metric]:
        stats = self.router.stats()
        index, calibration = stats.index, stats.calibration
        yield GaugeMetricFamily("kvgate_prefix_index_blocks", "Distinct blocks in the prefix index.", index.blocks)
        yield GaugeMetricFamily("kvgate_prefix_index_bytes", "Approximate memory of the index.", index.approx_bytes)
        yield CounterMetricFamily(
            "kvgate_prefix_index_evictions", "Blocks evicted from the index to respect a capacity.", index.evictions
        )
        blocks = _gauge("kvgate_prefix_index_replica_blocks", "Blocks the index puts on a backend.", "backend", "kind")
        for name, replica in index.per_replica.items():
            blocks.add_metric([name, "confirmed"], replica.blocks)
            blocks.add_metric([name, "speculative"], replica.speculative_blocks)
        yield blocks
        yield from _kv_events(index.kv_events)
        sessions = _gauge("kvgate_active_sessions", "Active sessions (client keys) routed to a backend.", "backend")
        footprint = _gauge(
            "kvgate_session_footprint_blocks", "KV blocks the active sessions' turns added on a backend.", "backend"
        )
        for name, replica_sessions in stats.sessions.items():
            sessions.add_metric([name], replica_sessions.sessions)
            footprint.add_metric([name], replica_sessions.blocks)
        yield from (sessions, footprint)
        yield GaugeMetricFamily(
            "kvgate_prediction_exact_ratio",
            "Share of requests whose predicted cached tokens equal the reported ones.",
            calibration.exact_fraction,
        )
        yield GaugeMetricFamily(
            "kvgate_prediction_mean_abs_error_tokens",
            "Mean |predicted - reported| cached tokens per request.",
            calibration.mean_abs_error_tokens,
        )
        answers = stats.answer_lengths
        yield GaugeMetricFamily(
            "kvgate_answers_known", "Completed answers whose length the P/D decider learns from.", answers.known
        )
        if answers.median_share_of_bound is not None:
            yield GaugeMetricFamily(
                "kvgate_answer_length_median_share_of_max_tokens",
                "The median completed answer's length over its max_tokens (1: clients cap answers tightly).",
                answers.median_share_of_bound,
            )


def _kv_events(streams: dict[str, SubscriberStats]) -> Iterator[Metric]:
    received = _counter("kvgate_kv_event_batches", "KV-event batches received.", "backend")
    lost = _counter("kvgate_kv_event_lost_batches", "KV-event batches missed (sequence gaps).", "backend")
    lag = _gauge("kvgate_kv_event_lag_seconds", "Age of a backend's latest KV-event batch on arrival.", "backend")
    for name, stream in streams.items():
        received.add_metric([name], stream.received)
        lost.add_metric([name], stream.lost_batches)
        if stream.lag_s is not None:
            lag.add_metric([name], stream.lag_s)
    yield from (received, lost, lag)
