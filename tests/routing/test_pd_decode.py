"""Where a split request decodes (gateway/routing/pd_decode.py): the router's placement, or the
replica where the split costs least once its prefill runs elsewhere."""

import dataclasses

from gateway.admission.kv_blocks import blocks_needed
from gateway.routing.pd_decider import PdDecision
from gateway.routing.pd_decode import DECODE_COST_REASON, split_decode_placement
from gateway.routing.pd_leg import place_prefill_leg
from gateway.routing.placement import Placement, place
from gateway.routing.router import Router
from gateway.routing.types import RouteRequest
from tests.routing.helpers import pd_replica as replica
from tests.routing.helpers import request, router, warm
from tests.routing.test_pd_leg import TRANSFER_S, Slot

BLOCK = 16
LONG = request(1, prompt_tokens=3000)
"""3,000 prompt tokens; the first 960 are on the owner once ``warm``."""


def split_on_owner(
    routing: Router, owner: Slot, transfer_s: float
) -> tuple[Placement[Slot], Placement[Slot], PdDecision]:
    """The router's placement of ``LONG`` on ``owner``, its prefill leg on an idle ``prefill`` replica
    and the decider's verdict there (a split: ``owner`` runs 8 decodes a local prefill would stall)."""
    routed = place(routing, LONG, [owner], BLOCK)
    assert routed is not None and routed.backend is owner
    cached = routed.decision.predicted_cached_tokens
    leg, verdict = place_prefill_leg(
        routing, LONG, owner.state(), cached, [Slot(replica("p"))], BLOCK, lambda _: False, transfer_s
    )
    assert leg is not None and verdict.disaggregate
    return routed, leg, verdict


def decode_on(
    routing: Router, owner: Slot, others: list[Slot], transfer_s: float = TRANSFER_S, req: RouteRequest = LONG
) -> tuple[Placement[Slot], PdDecision, Placement[Slot], PdDecision]:
    routed, leg, verdict = split_on_owner(routing, owner, transfer_s)
    placed, costed = split_decode_placement(
        routing, req, routed, verdict, leg, [owner, *others], BLOCK, Slot.state, transfer_s
    )
    return placed, costed, routed, verdict


def test_a_split_request_decodes_where_its_queue_is_shortest_when_moving_the_kv_is_cheap() -> None:
    routing = router(names=("owner", "idle", "p"))
    warm(routing, "owner", 1)
    owner, idle = Slot(replica("owner", running=8, queued=1500)), Slot(replica("idle", running=1))
    placed, costed, routed, verdict = decode_on(routing, owner, [idle])
    assert placed.backend is idle
    decision = placed.decision
    assert (decision.backend, decision.reason, decision.predicted_cached_tokens) == ("idle", DECODE_COST_REASON, 0)
    assert decision.hold is None and decision.ranked == routed.decision.ranked
    assert placed.uncached_tokens == LONG.prompt_tokens
    assert placed.kv_blocks == blocks_needed(LONG.prompt_tokens, LONG.max_tokens, BLOCK)
    assert placed.ticket.cached == routed.ticket.cached, "the router's ticket, settled on the replica it went to"
    assert costed.disaggregate and costed.split_cost_s < verdict.split_cost_s
    assert costed.local_cost_s == verdict.local_cost_s, "the local way it beat is the owner's"
    assert costed.reason == f"pd-split: est {costed.split_cost_s:.2f}s vs local {verdict.local_cost_s:.2f}s"


def test_the_owner_keeps_a_split_request_when_moving_its_prefix_costs_more_than_its_queue() -> None:
    routing = router(names=("owner", "idle", "p"))
    warm(routing, "owner", 1)
    owner, idle = Slot(replica("owner", running=8, queued=20)), Slot(replica("idle"))
    slow_link = 1e-4  # the 960 tokens the owner holds take 0.1 s to move, its queue 0.06 s
    placed, costed, routed, verdict = decode_on(routing, owner, [idle], transfer_s=slow_link)
    assert placed is routed and costed is verdict


def test_the_routers_placement_stands_when_no_other_replica_is_cheaper() -> None:
    routing = router(names=("owner", "busy", "p"))
    owner, busy = Slot(replica("owner", running=8)), Slot(replica("busy", running=8, queued=4000))
    placed, costed, routed, verdict = decode_on(routing, owner, [busy])
    assert placed is routed and costed is verdict


def test_replicas_without_room_or_health_and_the_legs_replica_are_passed_over() -> None:
    routing = router(names=("owner", "idle", "p"))
    owner = Slot(replica("owner", running=8, queued=1500))
    full = Slot(replica("idle"), free_blocks=10)
    sick = Slot(dataclasses.replace(replica("idle"), healthy=False))
    leg_replica = Slot(replica("p"))
    for other in (full, sick, leg_replica):
        placed, _, routed, _ = decode_on(routing, owner, [other])
        assert placed is routed, other
