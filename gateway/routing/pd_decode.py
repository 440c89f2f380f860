"""Where a split request decodes: shared by the gateway (gateway/pd_dispatch.py) and ``bench
simulate-pd`` (bench/sim/sim_pd.py).

The router places a request where its time to first token is least, and that counts prefilling
the part of the prompt a replica lacks. Once the decider splits the request, the replica it
decodes on prefills none of it: it pulls the blocks it lacks from the prefill replica, so a prefix
held there saves only their transfer, and what the request waits for there is the queue ahead of
it, whose prefills then stall its decode steps. So a split request decodes where the decider's
split cost (the leg, the transfer of what that replica lacks, its queue) is least, among the
replicas that could have taken it as a client request. In ``bench simulate-pd`` this moved the
mixed fleet (one ``prefill`` replica, seven ``both``) from 54 to 56 of 56 trace windows at or
above the P/D bar, and raised its mean margin on Llama-3-70B TP4 by 0.5 (conversation) and 1.7
(synthetic) points, for 0.6 points less on Llama-3-8B synthetic and, past capacity, 1.5 less on
average (bench/notes/2026-12-04-split-decode-replica.md).
"""

from collections.abc import Callable, Sequence

from gateway.routing.context import RouteContext
from gateway.routing.pd_decider import PdDecision, transfer_s_per_token
from gateway.routing.placement import Placement, SlotT, placement_on
from gateway.routing.router import Router
from gateway.routing.types import ReplicaState, RouteRequest

DECODE_COST_REASON = "pd-decode-cost"
"""The route reason of a split request that decodes elsewhere than the router placed it."""


def split_decode_placement(
    router: Router,
    request: RouteRequest,
    routed: Placement[SlotT],
    verdict: PdDecision,
    leg: Placement[SlotT],
    candidates: Sequence[SlotT],
    block_size: int,
    state_of: Callable[[SlotT], ReplicaState],
    transfer_s: float | None = None,
) -> tuple[Placement[SlotT], PdDecision]:
    """The decode placement of a request the decider split (``verdict``, costed on ``routed``) with
    its prefill ``leg``: the one of ``routed`` and ``candidates`` (replicas a client request may go
    to, with room) where the split costs least, with the verdict there. The leg costs the same
    whichever replica decodes, so they differ by the transfer of what each lacks and the queue
    ahead of the request there. ``state_of(slot)``: the replica as the decider sees it;
    ``transfer_s``: seconds per token moved (default: the settings')."""
    settings = router.config.disaggregation
    per_token = transfer_s_per_token(settings) if transfer_s is None else transfer_s
    ticket = routed.ticket
    others = [slot for slot in candidates if slot.name not in (routed.backend.name, leg.backend.name)]
    states = {slot.name: state_of(slot) for slot in [routed.backend, *others]}
    context = RouteContext(request, list(states.values()), {}, {}, router.config)

    def decode_cost_s(name: str) -> float:
        uncached = request.prompt_tokens - ticket.cached.get(name, 0)
        return context.queue_wait_s(states[name]) + uncached * per_token

    routed_cost = decode_cost_s(routed.backend.name)
    best, best_cost = routed, routed_cost
    for slot in others:
        cost = decode_cost_s(slot.name)
        if cost < best_cost and states[slot.name].healthy:
            placed = placement_on(slot, ticket, request, block_size, DECODE_COST_REASON)
            if slot.fits(placed.kv_blocks):
                best, best_cost = placed, cost
    if best is routed:
        return routed, verdict
    split_cost = verdict.split_cost_s + best_cost - routed_cost
    reason = f"pd-split: est {split_cost:.2f}s vs local {verdict.local_cost_s:.2f}s"
    return best, PdDecision(True, reason, verdict.local_cost_s, split_cost)
