"""A whole benchmark in virtual time, in one process: kvgate's real ``Router`` in front of
simulated replicas (the engine's real scheduler and block manager, ``bench/sim/sim_replica.py``).

The gateway part is the gateway's own code, driven in virtual time: the one placement rule
(``gateway/routing/placement.py``: the router ranks the replicas, a request goes to the best one
with room for its KV blocks), the admission queue's order (``gateway/admission/admission_order.py``;
one tenant, no cap, no timeout), late binding's lines (``gateway/routing/late_binding.py``), and
per replica the gateway's own record of it (``gateway.backends.pool.Backend``: slots, KV
reservations, queued prefill, load view), settled per request by ``gateway/in_flight.py``.
``tests/bench/test_simulator_equals_gateway.py`` replays a run through the gateway's dispatcher
and checks it places every request the same way. Replicas' KV events reach the router's index at the end of each step
(precise mode); their load (running and waiting requests, queued prefill tokens) is read as their
scheduler counts it, as the bundled engine's load socket pushes it to the gateway in ``bench run``
(``SimFleet.load_reports``; off, the numbers health checks read from ``/stats`` are refreshed
every ``report_interval_s``, as the gateway's checker does). Nothing sleeps and nothing is timed by a
wall clock, so a run is exactly repeatable and thousands of requests over hundreds of replicas
take seconds to minutes.

Peers are modelled (``bench/sim/peer_models.py``), not run: sglang-router's ``cache_aware``, Dynamo's
KV router and llm-d's precise prefix-cache scheduling, each placing requests over the same
simulated replicas by its own rules (the precise ones fed the replicas' KV events). Not modelled:
network and gateway latency (about a millisecond in ``bench run``) and chat templates (token-id
workloads only).
"""

import dataclasses
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bench.harness.contenders import MODEL, Contender
from bench.harness.loadgen import LoadResult, RequestResult, sessions_of
from bench.sim.peer_models import (
    MODELLED_PEERS,
    PeerModel,
    build_peer,
    is_modelled,
    kv_index_of,
    metrics_scraper_of,
)
from bench.sim.sim_replica import SimReplica, SimRequest
from bench.workloads.types import BenchRequest
from engine.core.config import EngineConfig
from engine.core.session_retention import DEFAULT_SESSION_RETAIN_FRACTION, DEFAULT_SESSION_TTL_S, SessionRetention
from engine.sim.sim_runner import SimCosts
from gateway.admission.admission_order import AdmissionOrder
from gateway.admission.kv_blocks import blocks_needed
from gateway.backends.circuit_breaker import CircuitBreaker
from gateway.backends.load_view import LoadView
from gateway.backends.pool import Backend
from gateway.config import BackendSpec, HealthConfig
from gateway.in_flight import InFlight
from gateway.routing.config import RoutingConfig
from gateway.routing.late_binding import HeldStats, HoldLines
from gateway.routing.placement import Placement, place
from gateway.routing.retention_keys import retention_hint
from gateway.routing.router import ReplicaSpec, Router, RouteTicket
from gateway.routing.types import Hold, ReplicaState, RouteDecision, RouteRequest
from protocol.replica_stats import ReplicaLoad
from radix.hashing import block_hashes
from radix.kv_event_format import EventBatch
from radix.kv_event_ingest import KVEventApplier

SIM_KV_EVENTS = "sim://in-process"
"""The KV-event endpoint simulated replicas are given: it marks them precise for the router."""
SIM_TENANT = "bench"
"""The one tenant a benchmark's requests come from (``bench run`` sends them with one key)."""


@dataclass(frozen=True)
class SimFleet:
    replicas: int
    num_blocks: int
    costs: SimCosts
    block_size: int = 16
    kv_events: bool = True
    """The router follows the replicas' KV events (precise mode); else it predicts their caches."""
    max_num_seqs: int = EngineConfig.max_num_seqs
    max_num_batched_tokens: int = EngineConfig.max_num_batched_tokens
    report_interval_s: float = 2.0
    """How often the gateway's health checks refresh each replica's /stats (health.interval_s)."""
    host_blocks: int = 0
    """The engine's ``--host-kv-blocks``: a host-memory KV tier per replica (0: none)."""
    load_reports: bool = True
    """Replicas push their load as the bundled engine's load socket does (``bench run`` follows it):
    the router reads running and waiting requests and queued prefill tokens as the replica's
    scheduler counts them now. Off: only ``/stats`` every ``report_interval_s``, and queued prefill
    is the gateway's own count of the uncached prompt tokens it sent."""
    retention: bool = True
    """Behind kvgate, requests with a session key carry it as a retention hint, as the gateway sends
    it to bundled engines, which keep active sessions' latest turns (``--session-retain-fraction``);
    follow-ups without one carry the key the router inferred (``RouteDecision.retention_key``)."""
    client_max_tokens: int | None = None
    """Clients send this ``max_tokens`` and each answer still ends at its trace length, as an EOS
    ends it: the gateway and the replicas know only this loose bound of where an answer stops.
    None: the trace length is the client's ``max_tokens``, which is then exact."""

    @property
    def max_model_len(self) -> int:
        """As ``bench run`` starts its replicas: 8,192, or less when the KV cache is smaller."""
        return min(8192, self.num_blocks * self.block_size)


@dataclass
class SimOutcome:
    load: LoadResult
    served: list[int]
    """Requests each replica finished."""
    held: HeldStats


@dataclass(eq=False, kw_only=True)
class SimBackend(Backend):
    """A simulated replica behind the gateway's own record of it (slots, KV reservation, queued
    prefill, load view), which placement reads as the gateway does."""

    replica: SimReplica
    load_reports: bool = True
    """As the bundled engine's load socket: running and waiting requests and queued prefill tokens as
    the replica's scheduler counts them now (the socket reports every 50 ms). Off: the load view
    follows the /stats reports that ``refresh`` hands it, as the gateway's health checks do."""

    def state(self) -> ReplicaState:
        state = super().state()
        if not self.load_reports:
            return state
        scheduler = self.replica.scheduler
        return dataclasses.replace(
            state,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            queued_prefill_tokens=scheduler.queued_prefill_tokens(),
            prefix_waits=scheduler.prefix_waits(),
            prefill_tokens_per_s=self.replica.report()["prefill_tokens_per_s"] or None,
            decodes=tuple(self.replica.decodes()),
        )

    def refresh(self, now: float, health: HealthConfig) -> None:
        """A health check's read of the replica's /stats (without a load socket)."""
        if self.load_reports:
            return
        report = self.replica.report()
        self.load.stale_after_s = health.report_stale_after_s
        self.load.on_report(
            ReplicaLoad(
                ts=now,
                running=int(report["running"]),
                waiting=int(report["waiting"]),
                prefill_tokens_per_s=float(report["prefill_tokens_per_s"]) or None,
                decodes=self.replica.decodes(),
            )
        )


class VirtualFleet:
    """One contender (a kvgate policy, the client's direct round robin, or a modelled peer) over
    simulated replicas. ``seed`` breaks a modelled peer's ties (Dynamo's, llm-d's are random)."""

    def __init__(self, contender: Contender, fleet: SimFleet, seed: int = 0) -> None:
        if contender.kind not in ("kvgate", "direct") and not is_modelled(contender):
            raise ValueError(
                f"bench simulate runs kvgate policies, direct round robin and the modelled peers "
                f"({', '.join(peer.name for peer in MODELLED_PEERS)}), not {contender.name}"
            )
        self.fleet = fleet
        self.now = 0.0
        self._answer_tokens: dict[str, int] = {}
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._foreground = 0
        """Scheduled events other than the periodic /stats refresh: none left means nothing can move."""
        self._order = itertools.count()
        self._health = HealthConfig(interval_s=fleet.report_interval_s)
        self.backends = [
            self._backend(f"replica-{index}", fleet, contender.kind == "kvgate") for index in range(fleet.replicas)
        ]
        self._by_name = {backend.replica.name: backend for backend in self.backends}
        self.router: Router | None = None
        self._appliers: dict[str, KVEventApplier] = {}
        if contender.kind == "kvgate":
            self._build_router(contender)
        names = [b.replica.name for b in self.backends]
        self.peer: PeerModel | None = (
            build_peer(contender, names, fleet.block_size, seed) if is_modelled(contender) else None
        )
        self._round_robin = itertools.cycle(self.backends)
        self._admission: AdmissionOrder[Callable[[], bool]] = AdmissionOrder()
        """Requests no replica has room for; each entry places its request or says False."""
        self._holds: HoldLines[Callable[[], bool]] = HoldLines()
        """Late binding: per owner, requests held for it; each entry places its request or says False."""

    def _backend(self, name: str, fleet: SimFleet, kvgate: bool) -> SimBackend:
        """One simulated replica and the gateway's record of it, on the virtual clock."""
        retention = self._retention() if fleet.retention and kvgate else None
        replica = SimReplica(
            name,
            fleet.num_blocks,
            fleet.block_size,
            MODEL,
            fleet.costs,
            fleet.max_num_seqs,
            fleet.max_num_batched_tokens,
            fleet.max_model_len,
            fleet.host_blocks,
            retention,
        )
        spec = BackendSpec(name=name, url=f"http://{name}.sim.invalid", kv_capacity_blocks=fleet.num_blocks)
        return SimBackend(
            spec,
            MODEL,
            CircuitBreaker(name, self._health, self._clock),
            healthy=True,
            load=LoadView(self._health.report_stale_after_s, self._clock),
            replica=replica,
            load_reports=fleet.load_reports,
        )

    def _clock(self) -> float:
        return self.now

    def _retention(self) -> SessionRetention:
        """The engine's default session retention, on the virtual clock."""
        retained = int(DEFAULT_SESSION_RETAIN_FRACTION * self.fleet.num_blocks)
        return SessionRetention(retained, DEFAULT_SESSION_TTL_S, lambda: self.now)

    def _build_router(self, contender: Contender) -> None:
        config = RoutingConfig.model_validate({"policy": contender.policy, **contender.routing})
        events = SIM_KV_EVENTS if self.fleet.kv_events else None
        specs = [ReplicaSpec(b.replica.name, MODEL, events, self.fleet.num_blocks) for b in self.backends]
        self.router = Router(config, self.fleet.block_size, specs, clock=lambda: self.now)
        if self.fleet.kv_events:
            tracker = self.router.tracker
            self._appliers = {
                spec.name: KVEventApplier(
                    tracker.index, spec.name, MODEL, self.fleet.block_size, tracker.speculative, lambda: self.now
                )
                for spec in specs
            }

    def run(self, requests: Sequence[BenchRequest], users: int | None = None) -> SimOutcome:
        """Play the workload (open loop, or closed loop with ``users``) to the end."""
        results: list[RequestResult] = []
        sessions = sessions_of(requests)
        if users is None:
            for session in sessions:
                self._start_session(session, results, use_arrivals=True)
        else:
            pending = deque(sessions)

            def next_session() -> None:
                if pending:
                    self._start_session(pending.popleft(), results, use_arrivals=False, then=next_session)

            for _ in range(users):
                next_session()
        self._schedule(0.0, self._refresh_reports, background=True)
        if self.peer is not None and metrics_scraper_of(self.peer) is not None:
            self._schedule(0.0, self._scrape_peer_metrics, background=True)
        while self._foreground and len(results) < len(requests):
            self.now, order, action = heapq.heappop(self._events)
            if order >= 0:
                self._foreground -= 1
            action()
        if len(results) < len(requests):
            raise RuntimeError(f"simulation stalled with {len(requests) - len(results)} requests unfinished")
        duration = max((r.start_s + (r.e2e_s or 0.0) for r in results), default=0.0)
        return SimOutcome(
            LoadResult(sorted(results, key=lambda r: r.start_s), duration),
            [b.replica.served for b in self.backends],
            self._holds.stats(),
        )

    def _schedule(self, at: float, action: Callable[[], None], background: bool = False) -> None:
        """Run ``action`` at virtual time ``at`` (same-time events in the order scheduled)."""
        order = next(self._order)
        if background:
            order = -order - 1
        else:
            self._foreground += 1
        heapq.heappush(self._events, (at, order, action))

    def _refresh_reports(self) -> None:
        """The gateway's health round: each replica's /stats, then, as ``BackendPool.on_change`` has it,
        the admission queue's head and each owner's held head try again."""
        for backend in self.backends:
            backend.refresh(self.now, self._health)
        self._pump_admission()
        for owner in self._holds.owners():
            self._release_held(owner)
        self._schedule(self.now + self.fleet.report_interval_s, self._refresh_reports, background=True)

    def _scrape_peer_metrics(self) -> None:
        """A metrics-reading peer's periodic scrape of every replica (waiting queue, KV usage)."""
        scraper = metrics_scraper_of(self.peer) if self.peer is not None else None
        if scraper is None:
            return
        for backend in self.backends:
            replica = backend.replica
            scraper.observe(replica.name, len(replica.scheduler.waiting), replica.block_manager.usage)
        self._schedule(self.now + scraper.metrics_refresh_s, self._scrape_peer_metrics, background=True)

    def _start_session(
        self,
        session: list[BenchRequest],
        results: list[RequestResult],
        use_arrivals: bool,
        then: Callable[[], None] | None = None,
    ) -> None:
        turns = iter(session)

        def send_next(previous_end: float) -> None:
            request = next(turns, None)
            if request is None:
                if then is not None:
                    then()
                return
            ready = previous_end + request.think_s
            if use_arrivals:
                ready = max(ready, request.arrival_s)
            self._schedule(ready, lambda: self._send(request, results, send_next))

        send_next(self.now)

    def _send(self, request: BenchRequest, results: list[RequestResult], done: Callable[[float], None]) -> None:
        if request.prompt_ids is None:
            raise ValueError("bench simulate replays token-id workloads only (chat templates are not simulated)")
        prompt = list(request.prompt_ids)
        result = RequestResult(request.request_id, request.group, start_s=self.now, prompt_tokens=len(prompt))
        if len(prompt) >= self.fleet.max_model_len:
            result.status, result.error = 400, "prompt longer than the replicas' context"
            results.append(result)
            done(self.now)
            return
        route = self.route_request(request)

        def finished(sim_request: SimRequest, now: float) -> None:
            self._record(result, sim_request, now)
            results.append(result)
            done(now)

        def place() -> bool:
            return self._place(route, prompt, result, finished)

        self._admit(place)

    def _admit(self, place: Callable[[], bool]) -> None:
        """Place now if nobody waits, else queue behind those who do (the admission queue's order)."""
        if self._admission.anyone_at_or_above(0) or not place():
            self._admission.enqueue(SIM_TENANT, 0, place)

    def route_request(self, request: BenchRequest) -> RouteRequest:
        """The request as the gateway's router sees it: its token ids hashed in blocks, its user as its session."""
        prompt = list(request.prompt_ids or [])
        hashes = block_hashes(prompt, self.fleet.block_size, MODEL)
        max_tokens = self.fleet.client_max_tokens or request.max_tokens
        if self.fleet.client_max_tokens is not None:
            self._answer_tokens[request.request_id] = request.max_tokens
        return RouteRequest(request.request_id, MODEL, hashes, len(prompt), max_tokens, session_key=request.user)

    def answer_tokens(self, request_id: str) -> int | None:
        """The request's own answer length when it ends before the client's loose ``max_tokens``."""
        return self._answer_tokens.get(request_id)

    def _place(
        self,
        route: RouteRequest,
        prompt: list[int],
        result: RequestResult,
        finished: Callable[[SimRequest, float], None],
        may_hold: bool = True,
    ) -> bool:
        """Route and hand the request to a replica with room for its KV blocks, or hold it for its
        owner (late binding); False if it must wait in the admission FIFO."""
        decision, ticket, uncached, kv_blocks = self._choose(route, may_hold)
        if decision is None:
            return False
        if decision.hold is not None:
            self._hold(decision.hold, route, prompt, result, finished)
            return True
        self._dispatch(decision, ticket, uncached, kv_blocks, route, prompt, result, finished)
        return True

    def _hold(
        self,
        hold: Hold,
        route: RouteRequest,
        prompt: list[int],
        result: RequestResult,
        finished: Callable[[SimRequest, float], None],
    ) -> None:
        """Late binding, as gateway/routing/held_requests.py: wait in the owner's line (fewest uncached
        tokens first) until routing places the request, or route it unheld after ``max_wait_s``."""
        assert self.router is not None

        def try_release() -> bool:
            decision, ticket, uncached, kv_blocks = self._choose(route, may_hold=True)
            if decision is None or decision.hold is not None:
                return False
            self._dispatch(decision, ticket, uncached, kv_blocks, route, prompt, result, finished)
            return True

        entry = self._holds.hold(hold.owner, hold.uncached_tokens, try_release, self.now)

        def expire() -> None:
            if entry.gone:
                return
            self._holds.leave(hold.owner, entry, "timed_out", self.now)
            self._release_held(hold.owner)
            self._admit(lambda: self._place(route, prompt, result, finished, may_hold=False))

        self._schedule(self.now + self.router.config.late_binding.max_wait_s, expire)

    def _release_held(self, owner: str) -> None:
        """``owner`` may have freed capacity: its line's heads try to get placed, in order."""
        while (head := self._holds.head(owner)) is not None and head.item():
            self._holds.leave(owner, head, "released", self.now)

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
        backend = self._by_name[decision.backend]
        result.backend, result.route_reason, result.status = decision.backend, decision.reason, 200
        settle = self._send_to(backend, ticket, uncached, kv_blocks, route.prompt_tokens)
        name = backend.replica.name

        def first_token(now: float) -> None:
            settle.first_token()
            if self.peer is not None:
                self.peer.first_token(route.request_id)
            self._schedule(now, lambda: self._release_held(name))

        def done(sim_request: SimRequest, now: float) -> None:
            settle.finish(sim_request.seq.num_cached_tokens, True, sim_request.seq.num_output_tokens)
            if self.peer is not None:
                self.peer.finished(route.request_id)
            finished(sim_request, now)
            self._schedule(now, self._pump_admission)
            self._schedule(now, lambda: self._release_held(name))

        session = retention_hint(route, decision) if self.router is not None and self.fleet.retention else None
        stop_after = self.answer_tokens(route.request_id)
        backend.replica.add(prompt, route.max_tokens, self.now, first_token, done, session, stop_after=stop_after)
        self._start_step(backend.replica)

    def _send_to(
        self, backend: SimBackend, ticket: RouteTicket | None, uncached: int, kv_blocks: int, prompt_tokens: int
    ) -> "Settle":
        """Count the request on ``backend`` as the gateway does; a kvgate request also settles its ticket."""
        if self.router is not None and ticket is not None:
            flight = InFlight(self.router, Placement(backend, ticket, uncached, kv_blocks), uncached)
            flight.sent()
            return flight
        return _Occupied(backend, uncached, kv_blocks, prompt_tokens)

    def _choose(
        self, route: RouteRequest, may_hold: bool = True
    ) -> tuple[RouteDecision | None, RouteTicket | None, int, int]:
        """The gateway's placement: ranked replicas until one has room for the request's KV blocks
        (a decision to hold the request for its owner comes back as is)."""
        block_size = self.fleet.block_size
        kv_blocks = blocks_needed(route.prompt_tokens, route.max_tokens, block_size)
        if self.peer is not None:
            # The peers forward at once; the engine queues what does not fit.
            name, reason = self.peer.route(route.request_id, route.block_hashes, route.prompt_tokens)
            return RouteDecision(name, reason, 0, [name]), None, route.prompt_tokens, kv_blocks
        if self.router is None:
            backend = next(self._round_robin)
            decision = RouteDecision(backend.replica.name, "direct", 0, [backend.replica.name])
            return decision, None, route.prompt_tokens, kv_blocks
        placement = place(self.router, route, self._route_candidates(), block_size, may_hold)
        if placement is None:
            return None, None, 0, 0
        return placement.decision, placement.ticket, placement.uncached_tokens, placement.kv_blocks

    def _route_candidates(self) -> list[SimBackend]:
        """Replicas a request may be placed on (a P/D fleet, bench/sim/sim_pd.py: those that decode)."""
        return list(self.backends)

    def _pump_admission(self) -> None:
        """Place queued requests, oldest first, while they fit."""
        while (head := self._admission.head()) is not None and head.item():
            self._admission.served(head)

    def _start_step(self, replica: SimReplica) -> None:
        end = replica.start_step(self.now)
        if end is not None:
            self._schedule(end, lambda: self._finish_step(replica))

    def _finish_step(self, replica: SimReplica) -> None:
        events = replica.finish_step(self.now)
        applier = self._appliers.get(replica.name)
        if applier is not None and events:
            applier.apply(EventBatch(self.now, events))
        peer_index = kv_index_of(self.peer) if self.peer is not None else None
        if peer_index is not None and events:
            peer_index.apply(replica.name, events)
        self._start_step(replica)

    def _record(self, result: RequestResult, sim_request: SimRequest, now: float) -> None:
        seq = sim_request.seq
        times = sim_request.token_times_s
        result.ttft_s = times[0] - result.start_s
        result.itl_s = [later - earlier for earlier, later in itertools.pairwise(times)]
        result.e2e_s = now - result.start_s
        result.cached_tokens = seq.num_cached_tokens or 0
        result.output_tokens = seq.num_output_tokens


class Settle(Protocol):
    """How a placed request is settled at its first token and its end."""

    def first_token(self) -> None: ...

    def finish(
        self, cached_tokens: int | None, prefilled: bool, completed_output_tokens: int | None = None
    ) -> None: ...


class _Occupied:
    """A request placed by direct round robin or a modelled peer: its replica's counts, no ticket."""

    def __init__(self, backend: SimBackend, prefill_tokens: int, kv_blocks: int, prompt_tokens: int) -> None:
        self._occupancy = backend.occupy(prefill_tokens, kv_blocks, prompt_tokens)
        self.first_token = self._occupancy.__enter__()

    def finish(self, cached_tokens: int | None, prefilled: bool, completed_output_tokens: int | None = None) -> None:
        self._occupancy.__exit__(None, None, None)
