"""Prefill/decode fleets in virtual time: ``VirtualFleet`` with replica roles and a split decider.

Each replica takes a role: ``prefill``, ``decode`` or ``both``. kvgate's router picks the decode
replica among those that decode (prefix-aware, weighing their load) and the prefill replica
among those that prefill, the decode one excepted (for kvgate's decider as the gateway does,
gateway/routing/pd_leg.py); a decider then says whether to split. A fleet of ``both`` replicas
splits under kvgate's decider only with ``routing.disaggregation.among_both``, as in the
gateway. A split request runs as the gateway and the bundled connector run it (issue 32):

1. the prefill replica gets a copy with ``max_tokens`` 1 and prefills it;
2. the prefill replica pins the prompt's full blocks when the leg ends; the decode replica pulls
   the ones it lacks (its cached prefix counts): ``blocks x block_size x transfer_s_per_token``
   of virtual time, its steps going on meanwhile;
3. on arrival it installs them (the engine's ``install_remote``, as the bundled connector does,
   engine notes in /work/notes/pd_contract.md), queues the request, and the prefill replica
   unpins; the engine's prefix-hit path finds the blocks and only the last token's block is
   computed before decoding.

Deciders: ``never`` (aggregated), ``always`` (vLLM's P/D proxies), ``kvgate``
(gateway/routing/pd_decider.py), and models of the peers' rules: ``llm-d``'s
prefix-based-pd-decider (split when the decode replica's uncached suffix reaches
``nonCachedTokens``) and ``dynamo``'s conditional disaggregation (split when it exceeds
``max_local_prefill_length`` and fewer than ``max_prefill_queue_size`` requests wait for a prefill
worker). Every decider sees the same replicas picked by the same router, so only the decision
differs. Not modelled: a failed pull (the decode leg would prefill locally).
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bench.harness.contenders import Contender
from bench.harness.loadgen import RequestResult
from bench.sim.sim_replica import SimRequest
from bench.sim.simulate import SimBackend, SimFleet, VirtualFleet
from gateway.in_flight import InFlight
from gateway.routing.pd_decider import fleet_disaggregates
from gateway.routing.pd_decode import split_decode_placement
from gateway.routing.pd_leg import place_prefill_leg
from gateway.routing.placement import Placement, place
from gateway.routing.prefill_overflow import client_candidates
from gateway.routing.retention_keys import retention_hint
from gateway.routing.router import RouteTicket
from gateway.routing.types import ReplicaState, RouteDecision, RouteRequest

ROLES = ("prefill", "decode", "both")
DECIDERS = ("never", "always", "kvgate", "llm-d", "dynamo")
LLMD_NON_CACHED_TOKENS = 256
"""llm-d's ``nonCachedTokens`` ships as 0 (off); its examples use small values. 256: our pick."""
DYNAMO_MAX_LOCAL_PREFILL = 1000
"""Dynamo's ``max_local_prefill_length`` default (its vLLM disaggregated example)."""
DYNAMO_MAX_PREFILL_QUEUE = 2
"""Dynamo's ``max_prefill_queue_size`` default."""


@dataclass(frozen=True)
class PdSetup:
    roles: tuple[str, ...]
    """One role per replica, in replica order."""
    decider: str
    transfer_s_per_token: float
    """KV bytes per token / bandwidth: the wire time of one prompt token's KV."""
    llmd_non_cached_tokens: int = LLMD_NON_CACHED_TOKENS
    dynamo_max_local_prefill: int = DYNAMO_MAX_LOCAL_PREFILL
    dynamo_max_prefill_queue: int = DYNAMO_MAX_PREFILL_QUEUE


def split_roles(replicas: int, prefill: int, rest: str = "decode") -> tuple[str, ...]:
    """``prefill`` prefill replicas first, then ``rest`` replicas (``decode`` or ``both``); 0: all ``both``."""
    if prefill <= 0:
        return ("both",) * replicas
    if prefill >= replicas:
        raise ValueError(f"a P/D split needs a decode replica: {prefill} prefill of {replicas}")
    if rest not in ("decode", "both"):
        raise ValueError(f"the replicas beside the prefill ones decode: decode or both, got {rest!r}")
    return ("prefill",) * prefill + (rest,) * (replicas - prefill)


@dataclass(frozen=True)
class SplitLeg:
    """A split request's prefill leg and pull, for the timeline and the stats."""

    prefill: str
    decode: str
    prefill_done_s: float
    moved_blocks: int
    transfer_s: float


@dataclass
class PdStats:
    split: int = 0
    local: int = 0
    legs: dict[str, SplitLeg] = field(default_factory=dict)


class PdVirtualFleet(VirtualFleet):
    def __init__(self, contender: Contender, fleet: SimFleet, setup: PdSetup, seed: int = 0) -> None:
        if contender.kind != "kvgate":
            raise ValueError("P/D fleets run behind kvgate's router (the peers' deciders are modelled on it)")
        if len(setup.roles) != fleet.replicas or set(setup.roles) - set(ROLES):
            raise ValueError(f"one role of {ROLES} per replica, got {setup.roles}")
        if setup.decider not in DECIDERS:
            raise ValueError(f"unknown decider {setup.decider!r}; choose from {', '.join(DECIDERS)}")
        if "prefill" in setup.roles and setup.decider == "never":
            raise ValueError("prefill replicas serve nothing when the decider never splits")
        super().__init__(contender, fleet, seed)
        self.setup = setup
        self.roles = {backend.replica.name: role for backend, role in zip(self.backends, setup.roles, strict=True)}
        self.pd = PdStats()

    def _route_candidates(self) -> list[SimBackend]:
        """The replicas that serve clients; ``prefill`` ones too while the fleet is past capacity
        and ``prefill_overflow_s`` is set (gateway/routing/prefill_overflow.py), as the gateway's pool."""
        assert self.router is not None
        config = self.router.config
        return client_candidates(
            self.backends,
            lambda backend: self.roles[backend.replica.name] != "prefill",
            SimBackend.state,
            config.disaggregation,
            config.prefill_tokens_per_s,
        )

    def _dispatch(
        self,
        decision: RouteDecision,
        ticket: RouteTicket | None,
        uncached: int,
        kv_blocks: int,
        route: RouteRequest,
        prompt: list[int],
        result: RequestResult,
        finished: Callable[[SimRequest, float], None],
    ) -> None:
        routed = None if ticket is None else Placement(self._by_name[decision.backend], ticket, uncached, kv_blocks)
        prefill, split, why, decode = self._plan(decision, route, routed)
        if prefill is None or not split or decode is None:
            self.pd.local += 1
            super()._dispatch(decision, ticket, uncached, kv_blocks, route, prompt, result, finished)
            result.route_reason = f"{decision.reason} {why}"
            return
        self.pd.split += 1
        self._dispatch_split(decode, prefill, route, prompt, result, finished)
        result.route_reason = f"{decode.decision.reason} {why} prefill={prefill.backend.replica.name}"

    def _plan(
        self, decision: RouteDecision, route: RouteRequest, routed: Placement[SimBackend] | None
    ) -> tuple[Placement[SimBackend] | None, bool, str, Placement[SimBackend] | None]:
        """The prefill leg's placement, whether to split, why, and the decode placement: kvgate's
        decider as the gateway runs it (gateway/routing/pd_leg.py, gateway/routing/pd_decode.py),
        the others on the router's picks."""
        setup = self.setup
        if setup.decider == "never":
            return None, False, "pd-never", routed
        assert self.router is not None
        candidates = [
            backend
            for backend in self.backends
            if self.roles[backend.replica.name] != "decode" and backend.replica.name != decision.backend
        ]
        if setup.decider == "kvgate":
            if not fleet_disaggregates(setup.roles, self.router.config.disaggregation):
                return None, False, "pd-off: every replica both", routed
            leg, verdict = place_prefill_leg(
                self.router,
                route,
                self._decider_state(self._by_name[decision.backend]),
                decision.predicted_cached_tokens,
                candidates,
                self.fleet.block_size,
                self._decodes_there,
                setup.transfer_s_per_token,
                decode_prefills=self.roles[decision.backend] == "both",
            )
            if leg is None or routed is None or not verdict.disaggregate:
                return leg, verdict.disaggregate, verdict.reason, routed
            decode, verdict = split_decode_placement(
                self.router,
                route,
                routed,
                verdict,
                leg,
                self._route_candidates(),
                self.fleet.block_size,
                self._decider_state,
                setup.transfer_s_per_token,
            )
            return leg, True, verdict.reason, decode
        leg = place(self.router, replace(route, max_tokens=1), candidates, self.fleet.block_size, may_hold=False)
        if leg is None:
            return None, False, "pd-local: no prefill replica", routed
        split, why = self._peer_rule(decision, route)
        return leg, split, why, routed

    def _decider_state(self, backend: SimBackend) -> ReplicaState:
        """The replica as the decider sees it here: a ``decode`` replica's measured prefill rate left
        out (its prefills are mostly pulled prompts' tails)."""
        state = backend.state()
        return replace(state, prefill_tokens_per_s=None) if self.roles[backend.replica.name] == "decode" else state

    def _decodes_there(self, backend: SimBackend) -> bool:
        """The replica runs decodes: it serves both phases, or it serves clients past capacity."""
        return self.roles[backend.replica.name] == "both" or bool(backend.state().decodes)

    def _peer_rule(self, decision: RouteDecision, route: RouteRequest) -> tuple[bool, str]:
        """vLLM's proxies (always), llm-d's threshold and Dynamo's conditional disaggregation."""
        setup = self.setup
        uncached = route.prompt_tokens - decision.predicted_cached_tokens
        if setup.decider == "always":
            return True, "pd-always"
        if setup.decider == "llm-d":
            split = 0 < setup.llmd_non_cached_tokens <= uncached
            return split, f"llm-d {uncached}{'>=' if split else '<'}{setup.llmd_non_cached_tokens}"
        queue = sum(
            len(backend.replica.scheduler.waiting)
            for backend in self.backends
            if self.roles[backend.replica.name] == "prefill"
        )
        split = uncached > setup.dynamo_max_local_prefill and queue < setup.dynamo_max_prefill_queue
        return split, f"dynamo {uncached} tokens, prefill queue {queue}"

    def _dispatch_split(
        self,
        placement: Placement[SimBackend],
        prefill: Placement[SimBackend],
        route: RouteRequest,
        prompt: list[int],
        result: RequestResult,
        finished: Callable[[SimRequest, float], None],
    ) -> None:
        """Prefill leg, pull, decode leg; the gateway counts the request on both replicas."""
        assert self.router is not None
        router = self.router
        decision, decode, source = placement.decision, placement.backend, prefill.backend
        result.backend, result.status = decode.replica.name, 200
        decode_flight = InFlight(router, placement, 0)
        leg_flight = InFlight(router, prefill, prefill.uncached_tokens)
        decode_flight.sent()
        leg_flight.sent()

        def prefill_first_token(now: float) -> None:
            leg_flight.first_token()

        def prefill_done(sim_request: SimRequest, now: float) -> None:
            leg_flight.finish(sim_request.seq.num_cached_tokens, prefilled=True)
            self._schedule(now, self._pump_admission)
            held = decode.replica.prefix_hit_blocks(prompt)
            moved = max((len(prompt) - 1) // self.fleet.block_size - held, 0)
            transfer_s = moved * self.fleet.block_size * self.setup.transfer_s_per_token
            leg = SplitLeg(source.replica.name, decode.replica.name, now, moved, transfer_s)
            self.pd.legs[route.request_id] = leg
            pinned = sim_request.pinned
            self._schedule(now + transfer_s, lambda: decode_leg(held, moved, pinned))

        def decode_leg(held: int, moved: int, pinned: list[int]) -> None:
            source.replica.unpin(pinned)
            session = retention_hint(route, decision) if self.fleet.retention else None
            replica = decode.replica
            stop_after = self.answer_tokens(route.request_id)
            replica.add_pulled(
                prompt, route.max_tokens, self.now, held, moved, lambda now: None, decode_done, session, stop_after
            )
            self._start_step(replica)

        def decode_done(sim_request: SimRequest, now: float) -> None:
            decode_flight.finish(sim_request.seq.num_cached_tokens, True, sim_request.seq.num_output_tokens)
            finished(sim_request, now)
            self._schedule(now, self._pump_admission)

        source.replica.add(prompt, 1, self.now, prefill_first_token, prefill_done, hold_prompt_blocks=True)
        self._start_step(source.replica)
