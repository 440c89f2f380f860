"""Where a request's prefill leg goes, and whether it goes at all: shared by the gateway
(gateway/pd_dispatch.py) and ``bench simulate-pd`` (bench/sim/sim_pd.py).

The router ranks the prefill candidates by the leg's own time to first token, which is all that
matters on a dedicated ``prefill`` replica: the decider's split cost there adds only terms every
candidate shares, and the router's estimate of the leg's wait knows more (held prompts, like
hardware priced alike). A candidate that also decodes (``role: both``) pays for the leg in a stall
of its running decodes, which that ranking does not see: when any candidate decodes, the leg goes
where the decider's split cost (its TTFT plus the weighted stall) is least. In ``bench
simulate-pd`` that raised an all-``both`` fleet's goodput on every Llama-3-70B TP4 window (+2.8 to
+17 points), lowered it on 32 lightly loaded Llama-3-8B replicas (-0.6, -0.9: the linear stall
weight prices stalls that break no one's ITL, and legs pile onto the few quiet replicas), and left
dedicated prefill replicas better with the router's pick (bench/notes/2026-12-02-pd-prefill-choice.md).
Pricing a ``both`` replica's stall by the decodes it pushes past the ITL target (the decider's
docstring) turned the 32-replica loss (-0.8, -1.1 points) into a tie or better (+0.2, +0.1)
(bench/notes/2026-12-03-pd-decode-slack.md).
"""

import dataclasses
from collections.abc import Callable, Sequence

from gateway.routing.pd_decider import PdDecision, decide_disaggregation
from gateway.routing.placement import Placement, SlotT, place, placement_on
from gateway.routing.router import Router
from gateway.routing.types import ReplicaState, RouteRequest

NO_PREFILL_REPLICA = PdDecision(False, "pd-local: no prefill replica", 0.0, 0.0)


def place_prefill_leg(
    router: Router,
    request: RouteRequest,
    decode: ReplicaState,
    decode_cached: int,
    candidates: Sequence[SlotT],
    block_size: int,
    decodes_there: Callable[[SlotT], bool],
    transfer_s: float | None = None,
    decode_prefills: bool = False,
) -> tuple[Placement[SlotT] | None, PdDecision]:
    """The prefill leg's placement among ``candidates`` (None: none has room) and the decider's
    verdict for it. ``decode_cached``: the router's predicted cached prompt tokens on the decode
    replica; ``decodes_there(slot)``: the candidate also runs decodes (``role: both``);
    ``transfer_s``: seconds per token moved (default: the settings' bytes over bandwidth);
    ``decode_prefills``: the decode replica serves both phases (``role: both``)."""
    leg_request = dataclasses.replace(request, max_tokens=1)
    config = router.config
    settings = config.disaggregation

    def verdict(slot: SlotT, state: ReplicaState, cached: int) -> PdDecision:
        return decide_disaggregation(
            request,
            decode,
            decode_cached,
            state,
            cached,
            config,
            settings,
            transfer_s,
            prefill_decodes=decodes_there(slot),
            decode_prefills=decode_prefills,
            lengths=router.output_lengths,
        )

    if settings.mode != "conditional" or not any(decodes_there(slot) for slot in candidates):
        leg = place(router, leg_request, candidates, block_size, may_hold=False)
        if leg is None:
            return None, NO_PREFILL_REPLICA
        return leg, verdict(leg.backend, leg.backend.state(), leg.decision.predicted_cached_tokens)
    states = [slot.state() for slot in candidates]
    ticket = router.route(leg_request, states, may_hold=False)
    best: tuple[PdDecision, Placement[SlotT]] | None = None
    for slot, state in zip(candidates, states, strict=True):
        placed = placement_on(slot, ticket, leg_request, block_size, "pd-split-cost")
        if not state.healthy or not slot.fits(placed.kv_blocks):
            continue
        costed = verdict(slot, state, placed.decision.predicted_cached_tokens)
        if best is None or costed.split_cost_s < best[0].split_cost_s:
            best = costed, placed
    if best is None:
        return None, NO_PREFILL_REPLICA
    return best[1], best[0]
