"""Synthetic requests and replica snapshots for routing tests."""

import random

from gateway.routing.config import RoutingConfig
from gateway.routing.router import ReplicaSpec, Router
from gateway.routing.types import ReplicaState, RouteDecision, RouteRequest
from radix.hashing import block_hashes

BLOCK = 16
MODEL = "m"


def request(
    prefix: int, prompt_tokens: int = 1024, request_id: str = "r", session_key: str | None = None, model: str = MODEL
) -> RouteRequest:
    """A prompt whose first 960 tokens are shared by all requests with the same ``prefix``."""
    rng = random.Random(request_id)
    tokens = [prefix * 7919 + i for i in range(960)] + [rng.randrange(50000) for _ in range(prompt_tokens - 960)]
    hashes = block_hashes(tokens, BLOCK, model)
    return RouteRequest(request_id, model, hashes, prompt_tokens, 32, session_key=session_key, token_ids=tokens)


def state(
    name: str, in_flight: int = 0, prefill_tokens: int = 0, model: str = MODEL, healthy: bool = True, **metrics: object
) -> ReplicaState:
    return ReplicaState(name, model, healthy, in_flight, prefill_tokens, **metrics)


class Clock:
    """A settable clock for the router's (or a load view's) time."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


PD_RATE = 1000.0
"""Prefill tokens/s the P/D tests' replicas report."""


def pd_replica(name: str, running: int = 0, queued: int = 0) -> ReplicaState:
    """A replica as the P/D decider sees it: running decodes, queued prefill, ``PD_RATE``."""
    return ReplicaState(
        name,
        "m",
        True,
        in_flight=running,
        in_flight_prefill_tokens=queued,
        num_running=running,
        num_waiting=0,
        queued_prefill_tokens=queued,
        prefill_tokens_per_s=PD_RATE,
    )


def router(
    policy: str = "cache_aware", names: tuple[str, ...] = ("a", "b", "c"), precise: bool = False, **config: object
) -> Router:
    """``precise``: each replica has a KV-event endpoint (nothing listens there unless the router is started)."""
    specs = [
        ReplicaSpec(name, MODEL, f"tcp://127.0.0.1:{9000 + index}" if precise else None, None)
        for index, name in enumerate(names)
    ]
    return Router(RoutingConfig(policy=policy, **config), BLOCK, specs)


def warm(router_: Router, replica: str, prefix: int) -> None:
    """Make ``replica`` hold ``prefix`` (predicted mode) as if a request had been sent there."""
    insert(router_, request(prefix, request_id=f"warm-{replica}-{prefix}"), replica)


def insert(router_: Router, req: RouteRequest, replica: str) -> None:
    """Put ``req``'s blocks in ``replica``'s predicted cache without routing it (no routing counts)."""
    router_.tracker.record_routed(req.block_hashes, replica, None)


def route_and_send(
    router_: Router, req: RouteRequest, replicas: list[ReplicaState], backend: str | None = None
) -> RouteDecision:
    """Route ``req``, then tell the router it was sent to ``backend`` (by default where it chose)."""
    ticket = router_.route(req, replicas)
    router_.on_routed(ticket, backend or ticket.decision.backend)
    return ticket.decision
