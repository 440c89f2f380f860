"""The JSON the dashboard polls (GET /dashboard/stats.json): rolling series plus the state right now."""

import dataclasses
import time

from gateway.admission.queue import AdmissionQueue
from gateway.backends.pool import Backend, BackendPool
from gateway.observability.rolling_stats import Tally
from gateway.observability.telemetry import Telemetry
from gateway.routing.router import Router


def dashboard_stats(telemetry: Telemetry, pool: BackendPool, queue: AdmissionQueue, router: Router) -> dict:
    stats = telemetry.stats
    backends = pool.backends.values()
    replicas = [_replica(backend, stats.by_backend.get(backend.name) or Tally()) for backend in backends]
    saved_gpu_s = [replica["saved_gpu_s"] for replica in replicas if replica["saved_gpu_s"] is not None]
    waiting = queue.waiting_by_tenant()
    return {
        "generated_at": time.time(),
        "bucket_s": stats.bucket_s,
        "totals": {**stats.totals.summary(), "saved_gpu_s": sum(saved_gpu_s) if saved_gpu_s else None},
        "queue": {"depth": sum(waiting.values()), "by_tenant": waiting},
        "series": stats.series(),
        "replicas": replicas,
        "route_reasons": dict(stats.reasons.most_common()),
        "normalization": [
            {"rule": rule, "requests": entry.requests, "cached_tokens": entry.cached_tokens}
            for rule, entry in sorted(stats.normalization.items())
        ],
        "tenants": [
            {"tenant": name, **tally.summary(), "queued": waiting.get(name, 0)}
            for name, tally in sorted(stats.by_tenant.items())
        ],
        "pd": {
            "decisions": dict(stats.pd.most_common()),
            "prefill_legs": [
                {
                    "backend": name,
                    **dataclasses.asdict(legs),
                    "hit_rate": _ratio(legs.cached_tokens, legs.prompt_tokens),
                }
                for name, legs in sorted(stats.prefill_legs.items())
            ],
        },
        "prefix_breakers": telemetry.breakers.table(),
        "prefix_index": router.stats(),
    }


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _replica(backend: Backend, tally: Tally) -> dict:
    """One replica's load now (the state routing sees) and its savings since start; GPU-seconds from
    its measured prefill rate."""
    state = backend.state()
    prefill_rate = state.prefill_tokens_per_s
    has_rate = prefill_rate is not None and prefill_rate > 0
    return {
        "name": backend.name,
        "model": backend.model,
        "role": backend.spec.role,
        "healthy": backend.healthy,
        "draining": backend.draining,
        "circuit": backend.breaker.state.value,
        "in_flight": state.in_flight,
        "in_flight_prefill_tokens": state.in_flight_prefill_tokens,
        "num_running": state.num_running,
        "num_waiting": state.num_waiting,
        "queued_prefill_tokens": state.queued_prefill_tokens,
        "held_prefill_tokens": sum(tokens for tokens, _ in state.prefix_waits.values()),
        "load_reported": backend.load.fresh,
        "kv_usage": state.kv_usage,
        "prefill_tokens_per_s": prefill_rate if has_rate else None,
        **tally.summary(),
        "saved_tokens": tally.cached_tokens,
        "saved_gpu_s": tally.cached_tokens / prefill_rate if prefill_rate and has_rate else None,
    }
