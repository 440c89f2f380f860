"""A whole benchmark in virtual time, in one process: kvgate's real ``Router`` in front of
simulated replicas (the engine's real scheduler and block manager, ``bench/sim_replica.py``).

The gateway part mirrors ``gateway/dispatch.py``: the router ranks the replicas; a request goes
to the best one with room for its KV blocks (``gateway/admission/kv_blocks.py``), else waits in
a FIFO until a request finishes; the replica counts its uncached prompt tokens as queued prefill
until its first token. Replicas' KV events reach the router's index at the end of each step
(precise mode); their load (running and waiting requests, queued prefill tokens) is read as their
scheduler counts it, as the bundled engine's load socket pushes it to the gateway in ``bench run``
(``SimFleet.load_reports``; off, the numbers health checks read from ``/stats`` are refreshed
every ``report_interval_s``, as the gateway's checker does). Nothing sleeps and nothing is timed by a
wall clock, so a run is exactly repeatable and thousands of requests over hundreds of replicas
take seconds to minutes.

Peers are modelled (``bench/peer_models.py``), not run: sglang-router's ``cache_aware``, Dynamo's
KV router and llm-d's precise prefix-cache scheduling, each placing requests over the same
simulated replicas by its own rules (the precise ones fed the replicas' KV events). Not modelled:
network and gateway latency (about a millisecond in ``bench run``) and chat templates (token-id
workloads only).
"""

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.contenders import MODEL, Contender
from bench.loadgen import LoadResult, RequestResult, sessions_of
from bench.peer_models import (
    MODELLED_PEERS,
    PeerModel,
    build_peer,
    kv_index_of,
    metrics_scraper_of,
)
from bench.sim_replica import SimReplica, SimRequest
from bench.workloads.types import BenchRequest
from engine.config import EngineConfig
from engine.session_retention import DEFAULT_SESSION_RETAIN_FRACTION, DEFAULT_SESSION_TTL_S, SessionRetention
from engine.sim_runner import SimCosts
from gateway.admission.kv_blocks import blocks_needed, fits
from gateway.routing.config import RoutingConfig
from gateway.routing.late_binding import HoldLine
from gateway.routing.retention_keys import retention_hint
from gateway.routing.router import ReplicaSpec, Router, RouteTicket
from gateway.routing.types import Hold, ReplicaState, RouteDecision, RouteRequest
from radix.hashing import block_hashes
from radix.kv_event_format import EventBatch
from radix.kv_event_ingest import KVEventApplier

SIM_KV_EVENTS = "sim://in-process"
"""The KV-event endpoint simulated replicas are given: it marks them precise for the router."""


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

    @property
    def max_model_len(self) -> int:
        """As ``bench run`` starts its replicas: 8,192, or less when the KV cache is smaller."""
        return min(8192, self.num_blocks * self.block_size)


@dataclass
class SimHeldStats:
    """Late binding in a run: requests held, how they left, their total wait."""

    held: int = 0
    released: int = 0
    timed_out: int = 0
    wait_s_total: float = 0.0


@dataclass
class SimOutcome:
    load: LoadResult
    served: list[int]
    """Requests each replica finished."""
    held: SimHeldStats = field(default_factory=SimHeldStats)


@dataclass
class _Backend:
    """What the gateway's backend pool tracks per replica."""

    replica: SimReplica
    in_flight: int = 0
    in_flight_prefill_tokens: int = 0
    kv_reserved_blocks: int = 0
    reported: dict[str, float | int] = field(default_factory=dict)
    load_reports: bool = True

    def state(self) -> ReplicaState:
        queued: int | None = None
        rate: float | int | None
        running: int | None
        waiting: int | None
        if self.load_reports:
            scheduler = self.replica.scheduler
            running, waiting = len(scheduler.running), len(scheduler.waiting)
            queued = scheduler.queued_prefill_tokens()
            rate = self.replica.report()["prefill_tokens_per_s"]
        else:
            running, waiting = _int_or_none(self.reported.get("running")), _int_or_none(self.reported.get("waiting"))
            rate = self.reported.get("prefill_tokens_per_s")
        return ReplicaState(
            name=self.replica.name,
            model=MODEL,
            healthy=True,
            in_flight=self.in_flight,
            in_flight_prefill_tokens=self.in_flight_prefill_tokens,
            num_running=running,
            num_waiting=waiting,
            queued_prefill_tokens=queued,
            prefill_tokens_per_s=rate or None,
        )


def _int_or_none(value: float | int | None) -> int | None:
    return None if value is None else int(value)


class VirtualFleet:
    """One contender (a kvgate policy, the client's direct round robin, or a modelled peer) over
    simulated replicas. ``seed`` breaks a modelled peer's ties (Dynamo's, llm-d's are random)."""

    def __init__(self, contender: Contender, fleet: SimFleet, seed: int = 0) -> None:
        if contender.kind not in ("kvgate", "direct") and contender not in MODELLED_PEERS:
            raise ValueError(
                f"bench simulate runs kvgate policies, direct round robin and the modelled peers "
                f"({', '.join(peer.name for peer in MODELLED_PEERS)}), not {contender.name}"
            )
        self.fleet = fleet
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._foreground = 0
        """Scheduled events other than the periodic /stats refresh: none left means nothing can move."""
        self._order = itertools.count()
        self.backends = [
            _Backend(
                SimReplica(
                    f"replica-{index}",
                    fleet.num_blocks,
                    fleet.block_size,
                    MODEL,
                    fleet.costs,
                    fleet.max_num_seqs,
                    fleet.max_num_batched_tokens,
                    fleet.max_model_len,
                    fleet.host_blocks,
                    self._retention() if fleet.retention and contender.kind == "kvgate" else None,
                ),
                load_reports=fleet.load_reports,
            )
            for index in range(fleet.replicas)
        ]
        self._by_name = {backend.replica.name: backend for backend in self.backends}
        self.router: Router | None = None
        self._appliers: dict[str, KVEventApplier] = {}
        if contender.kind == "kvgate":
            self._build_router(contender)
        names = [b.replica.name for b in self.backends]
        self.peer: PeerModel | None = (
            build_peer(contender, names, fleet.block_size, seed) if contender in MODELLED_PEERS else None
        )
        self._round_robin = itertools.cycle(self.backends)
        self._admission: deque[Callable[[], bool]] = deque()
        self._held: dict[str, HoldLine[Callable[[], bool]]] = {}
        """Late binding: per owner, requests held for it; each entry places its request or says False."""
        self.held_stats = SimHeldStats()

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
            self.held_stats,
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
        for backend in self.backends:
            backend.reported = backend.replica.report()
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
        route = RouteRequest(
            request.request_id,
            MODEL,
            block_hashes(prompt, self.fleet.block_size, MODEL),
            len(prompt),
            request.max_tokens,
            session_key=request.user,
        )

        def finished(sim_request: SimRequest, now: float) -> None:
            self._record(result, sim_request, now)
            results.append(result)
            done(now)

        def place() -> bool:
            return self._place(route, prompt, result, finished)

        if self._admission or not place():
            self._admission.append(place)

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
        """Late binding, as gateway/admission/held.py: wait in the owner's line (fewest uncached
        tokens first) until routing places the request, or route it unheld after ``max_wait_s``."""
        assert self.router is not None
        line = self._held.setdefault(hold.owner, HoldLine())
        held_since = self.now

        def try_release() -> bool:
            decision, ticket, uncached, kv_blocks = self._choose(route, may_hold=True)
            if decision is None or decision.hold is not None:
                return False
            self.held_stats.released += 1
            self.held_stats.wait_s_total += self.now - held_since
            self._dispatch(decision, ticket, uncached, kv_blocks, route, prompt, result, finished)
            return True

        entry = line.push(hold.uncached_tokens, try_release)
        self.held_stats.held += 1

        def expire() -> None:
            if entry.gone:
                return
            line.remove(entry)
            self.held_stats.timed_out += 1
            self.held_stats.wait_s_total += self.now - held_since
            self._release_held(hold.owner)
            if self._admission or not self._place(route, prompt, result, finished, may_hold=False):
                self._admission.append(lambda: self._place(route, prompt, result, finished, may_hold=False))

        self._schedule(self.now + self.router.config.late_binding.max_wait_s, expire)

    def _release_held(self, owner: str) -> None:
        """``owner`` may have freed capacity: its line's heads try to get placed, in order."""
        line = self._held.get(owner)
        head = line.head() if line is not None else None
        while line is not None and head is not None and head.item():
            line.remove(head)
            head = line.head()

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
        if self.router is not None and ticket is not None:
            self.router.on_routed(ticket, backend.replica.name)
        backend.in_flight += 1
        backend.in_flight_prefill_tokens += uncached
        backend.kv_reserved_blocks += kv_blocks
        name = backend.replica.name

        def first_token(now: float) -> None:
            backend.in_flight_prefill_tokens -= uncached
            if self.peer is not None:
                self.peer.first_token(route.request_id)
            self._schedule(now, lambda: self._release_held(name))

        def done(sim_request: SimRequest, now: float) -> None:
            backend.in_flight -= 1
            backend.kv_reserved_blocks -= kv_blocks
            if self.router is not None and ticket is not None:
                self.router.on_finished(ticket, sim_request.seq.num_cached_tokens, ok=True)
            if self.peer is not None:
                self.peer.finished(route.request_id)
            finished(sim_request, now)
            self._schedule(now, self._pump_admission)
            self._schedule(now, lambda: self._release_held(name))

        session = retention_hint(route, decision) if self.router is not None and self.fleet.retention else None
        backend.replica.add(prompt, route.max_tokens, self.now, first_token, done, session)
        self._start_step(backend.replica)

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
        candidates = self._route_candidates()
        while candidates:
            ticket = self.router.route(route, [backend.state() for backend in candidates], may_hold)
            decision = ticket.decision
            backend = self._by_name[decision.backend]
            uncached = route.prompt_tokens - decision.predicted_cached_tokens
            kv_blocks = blocks_needed(uncached, route.max_tokens, block_size)
            if decision.hold is not None or fits(backend.kv_reserved_blocks, kv_blocks, self.fleet.num_blocks):
                return decision, ticket, uncached, kv_blocks
            candidates.remove(backend)
        return None, None, 0, 0

    def _route_candidates(self) -> list[_Backend]:
        """Replicas a request may be placed on (a P/D fleet, bench/sim_pd.py: those that decode)."""
        return list(self.backends)

    def _pump_admission(self) -> None:
        """Place queued requests, oldest first, while they fit."""
        while self._admission and self._admission[0]():
            self._admission.popleft()

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
