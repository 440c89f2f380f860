"""Where a routed request goes: the one placement rule, free of clocks and I/O.

The router ranks the candidate replicas; the first that has room for the request's KV blocks
(``gateway/admission/kv_blocks.py``) is the placement; a decision to hold the request for its
owner (late binding, ``gateway/routing/late_binding.py``) comes back as is; None means none has
room and the request waits in the admission queue. The gateway's dispatcher drives it in real
time (``gateway/dispatch.py``), the endpoint picker within the data plane's subset
(``gateway/epp/placement.py``) and ``kvgate bench simulate`` in virtual time
(``bench/sim/simulate.py``): all three place by this code, so the simulator's verdicts on routing are
the gateway's (``tests/bench/test_simulator_equals_gateway.py``).
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from gateway.admission.kv_blocks import blocks_needed
from gateway.routing.router import Router, RouteTicket
from gateway.routing.types import ReplicaState, RouteDecision, RouteRequest


class Slot(Protocol):
    """A replica as placement sees it: its load for the router, and whether a request fits."""

    @property
    def name(self) -> str: ...

    def state(self) -> ReplicaState: ...

    def fits(self, kv_blocks: int) -> bool: ...


SlotT = TypeVar("SlotT", bound=Slot)


@dataclass(frozen=True)
class Placement(Generic[SlotT]):
    backend: SlotT
    ticket: RouteTicket
    """The router's decision, settled by the driver once the request is sent and answered."""
    uncached_tokens: int
    kv_blocks: int

    @property
    def decision(self) -> RouteDecision:
        return self.ticket.decision


def place(
    router: Router, request: RouteRequest, candidates: Sequence[SlotT], block_size: int, may_hold: bool = True
) -> Placement[SlotT] | None:
    """The best-ranked candidate with room for the request's KV blocks, or a hold; None when all are full."""
    remaining = list(candidates)
    while remaining:
        ticket = router.route(request, [slot.state() for slot in remaining], may_hold)
        decision = ticket.decision
        slot = next(slot for slot in remaining if slot.name == decision.backend)
        uncached = request.prompt_tokens - decision.predicted_cached_tokens
        kv_blocks = blocks_needed(uncached, request.max_tokens, block_size)
        if decision.hold is not None or slot.fits(kv_blocks):
            return Placement(slot, ticket, uncached, kv_blocks)
        remaining.remove(slot)
    return None


def placement_on(
    slot: SlotT, ticket: RouteTicket, request: RouteRequest, block_size: int, reason: str
) -> Placement[SlotT]:
    """``request`` placed on ``slot`` instead of where ``ticket`` routed it (a P/D leg or decode
    costed past the router's ranking): the ticket's decision names ``slot``, its predicted cached
    tokens and ``reason``; unchanged when ``slot`` is the router's pick."""
    cached = ticket.cached.get(slot.name, 0)
    if ticket.decision.backend != slot.name:
        decision = replace(ticket.decision, backend=slot.name, reason=reason, predicted_cached_tokens=cached, hold=None)
        ticket = replace(ticket, decision=decision)
    uncached = request.prompt_tokens - cached
    return Placement(slot, ticket, uncached, blocks_needed(uncached, request.max_tokens, block_size))
