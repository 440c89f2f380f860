"""Where a picked request goes: the dispatcher's placement rule, within the data plane's subset hint.

The rule is the gateway's one placement rule (gateway/routing/placement.py), as the dispatcher
applies it: among the usable replicas of the model (and adapter) with a free slot, the router
ranks; the first that has room for the request's KV blocks is the placement, else the admission
queue waits for room. Two differences, both from the
protocol: only replicas in the subset hint are eligible (none: 503, GIE's
docs/proposals/004-endpoint-picker-protocol/README.md), and late binding never holds a request,
since the picker answers Envoy once and cannot re-route a request it has already handed over.
"""

from urllib.parse import urlsplit

from gateway.backends.pool import Backend
from gateway.errors import service_unavailable
from gateway.routing import placement
from gateway.routing.types import RouteRequest
from gateway.routing_core import RoutingCore


def address(backend: Backend) -> str:
    """The replica as the data plane names it: ``host:port`` of its URL."""
    return urlsplit(backend.spec.url).netloc


def place(
    core: RoutingCore, request: RouteRequest, subset: frozenset[str] | None
) -> placement.Placement[Backend] | None:
    """A replica with a free slot and room for the request's KV blocks; None when all are full.

    503 when no replica of the model is usable, or none of the subset is."""
    routing = core.router.config
    usable = [
        backend
        for backend in core.pool.usable(request.model, routing.disaggregation, routing.prefill_tokens_per_s)
        if backend.serves_adapter(request.adapter) and (subset is None or address(backend) in subset)
    ]
    if not usable:
        where = f" among the {len(subset)} endpoints of the subset hint" if subset is not None else ""
        serving = f"adapter '{request.adapter}' of '{request.model}'" if request.adapter else f"'{request.model}'"
        raise service_unavailable(f"No healthy replica of {serving} is available{where}.", retry_after_s=1)
    candidates = [backend for backend in usable if backend.has_room]
    return placement.place(core.router, request, candidates, core.config.block_size, may_hold=False)
