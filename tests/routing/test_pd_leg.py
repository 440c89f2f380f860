"""Where a prefill leg goes (gateway/routing/pd_leg.py): the router's pick among dedicated prefill
replicas, the least split cost among replicas that also decode."""

import dataclasses
from dataclasses import dataclass

from gateway.routing.pd_leg import place_prefill_leg
from gateway.routing.placement import place
from gateway.routing.router import Router
from gateway.routing.types import ReplicaState, RouteRequest
from protocol.replica_stats import DecodeProgress
from tests.routing.helpers import pd_replica as replica
from tests.routing.helpers import request, router, warm

TRANSFER_S = 1e-5


@dataclass
class Slot:
    """A candidate as placement sees it: its load, and room for so many KV blocks."""

    load: ReplicaState
    free_blocks: int = 10_000

    @property
    def name(self) -> str:
        return self.load.name

    def state(self) -> ReplicaState:
        return self.load

    def fits(self, kv_blocks: int) -> bool:
        return kv_blocks <= self.free_blocks


DECODE = replica("d", running=8)
LONG = request(1, prompt_tokens=3000)
"""3,000 prompt tokens, none cached on the decode replica: a split is worth costing."""


def leg(
    routing: Router, candidates: list[Slot], both: set[str], req: RouteRequest = LONG
) -> tuple[str | None, bool, str]:
    placed, verdict = place_prefill_leg(
        routing, req, DECODE, 0, candidates, 16, lambda slot: slot.name in both, TRANSFER_S
    )
    return (placed.backend.name if placed else None), verdict.disaggregate, verdict.reason


def busy_and_quiet() -> list[Slot]:
    """``busy`` starts a leg sooner (no queued prefill) but runs 40 decodes a leg would stall;
    ``quiet`` has a little prefill queued and 2 decodes."""
    return [Slot(replica("busy", running=40)), Slot(replica("quiet", running=2, queued=400))]


def test_the_router_ranks_the_busy_replica_first_for_the_leg_alone() -> None:
    routing = router(names=("d", "busy", "quiet"))
    placed = place(routing, LONG, busy_and_quiet(), 16, may_hold=False)
    assert placed is not None and placed.backend.name == "busy"


def test_among_replicas_that_decode_the_leg_goes_where_the_split_stalls_least() -> None:
    routing = router(names=("d", "busy", "quiet"))
    name, split, reason = leg(routing, busy_and_quiet(), both={"busy", "quiet"})
    assert name == "quiet"
    assert split and reason.startswith("pd-split")


def test_dedicated_prefill_replicas_keep_the_routers_pick() -> None:
    routing = router(names=("d", "busy", "quiet"))
    name, _, _ = leg(routing, busy_and_quiet(), both=set())
    assert name == "busy"


def test_a_leg_moved_off_the_routers_pick_names_its_replica_and_that_replicas_cached_tokens() -> None:
    routing = router(names=("d", "busy", "quiet"))
    warm(routing, "busy", 1)
    placed, _ = place_prefill_leg(routing, LONG, DECODE, 0, busy_and_quiet(), 16, lambda slot: True, TRANSFER_S)
    assert placed is not None and placed.backend.name == "quiet"
    assert placed.ticket.cached["busy"] == 960 and placed.ticket.cached.get("quiet", 0) == 0
    assert (placed.decision.backend, placed.decision.predicted_cached_tokens) == ("quiet", 0)
    assert placed.decision.reason == "pd-split-cost" and placed.decision.hold is None
    assert placed.uncached_tokens == LONG.prompt_tokens


def test_a_replica_without_room_for_the_prompt_is_passed_over() -> None:
    routing = router(names=("d", "busy", "quiet"))
    busy, quiet = busy_and_quiet()
    quiet.free_blocks = 10
    name, _, _ = leg(routing, [busy, quiet], both={"busy", "quiet"})
    assert name == "busy"


def test_an_unhealthy_replica_is_passed_over() -> None:
    routing = router(names=("d", "busy", "quiet"))
    busy, quiet = busy_and_quiet()
    quiet.load = dataclasses.replace(quiet.load, healthy=False)
    name, _, _ = leg(routing, [busy, quiet], both={"busy", "quiet"})
    assert name == "busy"


def test_no_candidate_with_room_means_a_local_prefill() -> None:
    routing = router(names=("d", "busy", "quiet"))
    slots = [Slot(replica("busy", running=40), free_blocks=0), Slot(replica("quiet"), free_blocks=0)]
    for both in (set(), {"busy", "quiet"}):
        assert leg(routing, slots, both) == (None, False, "pd-local: no prefill replica")


def test_modes_other_than_conditional_take_the_routers_pick() -> None:
    routing = router(names=("d", "busy", "quiet"), disaggregation={"mode": "always"})
    name, split, reason = leg(routing, busy_and_quiet(), both={"busy", "quiet"})
    assert (name, split, reason) == ("busy", True, "pd-always")


def test_among_replicas_that_report_their_decodes_the_leg_goes_where_it_breaks_fewest() -> None:
    """``busy``'s 40 decodes have seconds of room under 50 ms a token; ``quiet``'s 2 have a tenth of
    a second: priced per decode delayed the leg would go to ``quiet``, priced by decodes broken to ``busy``."""
    routing = router(names=("d", "busy", "quiet"))
    busy, quiet = busy_and_quiet()
    busy.load = dataclasses.replace(busy.load, decodes=(DecodeProgress(200, 2.0, 500),) * 40)
    quiet.load = dataclasses.replace(quiet.load, decodes=(DecodeProgress(20, 0.9, 500),) * 2)
    placed, verdict = place_prefill_leg(
        routing, LONG, DECODE, 0, [busy, quiet], 16, lambda slot: True, TRANSFER_S, decode_prefills=True
    )
    assert placed is not None and placed.backend.name == "busy"
    assert verdict.disaggregate
