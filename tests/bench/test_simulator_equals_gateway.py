"""``kvgate bench simulate`` places every request as the gateway's dispatcher does.

One run of the simulator is recorded: each request's arrival, each /stats report, each first
token and each end, in the order and at the virtual time they happened, and where each request
was placed. The same sequence is then replayed through the gateway's own ``Dispatcher`` (its
admission queue, late binding's lines and the placement rule, in real asyncio tasks) over a
``BackendPool`` of replicas that answer when the recording says they did, with a router of the
same configuration on the replayed clock. Every request must land on the same replica for the
same reason, and the same requests must be held for their owners. The workload overloads the
replicas so that requests queue for room and late binding holds load spills.
"""

import asyncio
from dataclasses import dataclass, field

import pytest

from bench.cli import scaled_costs
from bench.harness.contenders import Contender
from bench.sim.simulate import MODEL, SIM_TENANT, Settle, SimBackend, SimFleet, VirtualFleet
from bench.workloads.multi_turn import MultiTurnParams
from bench.workloads.multi_turn import generate as multi_turn
from bench.workloads.types import BenchRequest
from engine.sim.sim_runner import SMOLLM2_CPU
from gateway.admission.queue import AdmissionQueue
from gateway.backends.circuit_breaker import CircuitBreaker
from gateway.backends.load_view import LoadView
from gateway.backends.pool import Backend, BackendPool
from gateway.config import BackendSpec, HealthConfig, TimeoutsConfig
from gateway.dispatch import Dispatcher
from gateway.in_flight import InFlight
from gateway.routing.config import RoutingConfig
from gateway.routing.router import ReplicaSpec, Router, RouteTicket
from protocol.replica_stats import ReplicaLoad

COSTS = scaled_costs(SMOLLM2_CPU, 75e-6)
ROUTING = {"policy": "cache_aware", "ttft_target_s": 0.2, "late_binding": {"enabled": True, "max_wait_s": 600.0}}
"""Late binding on; its wait long enough that no hold times out (the gateway times a hold out on the
wall clock, which a replay does not follow)."""


def fleet_of(num_blocks: int) -> SimFleet:
    """The gateway's own view: it predicts the replicas' caches and counts their load from what it
    sent and their /stats."""
    return SimFleet(replicas=3, num_blocks=num_blocks, costs=COSTS, kv_events=False, load_reports=False)


@dataclass
class Recording:
    events: list[tuple[float, str, object]] = field(default_factory=list)
    """(virtual time, kind, what): ``arrive`` a request, ``report`` the replicas' loads, ``first_token``
    and ``finish`` (request id, cached tokens) of a request."""
    placed: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Request id: the replica it went to and why."""
    queued: int = 0
    """Arrivals that found no replica with room (or others already waiting) and queued."""


class RecordedFleet(VirtualFleet):
    """The simulator as it runs, with every event the gateway would see written down."""

    def __init__(self, recording: Recording, fleet: SimFleet) -> None:
        super().__init__(Contender("kvgate", "cache_aware", ROUTING), fleet)
        self.recording = recording

    def _send(self, request: BenchRequest, results: list, done: object) -> None:
        self.recording.events.append((self.now, "arrive", request))
        super()._send(request, results, done)  # type: ignore[arg-type]
        self.recording.queued += request.request_id not in self.recording.placed and len(self._holds) == 0

    def _refresh_reports(self) -> None:
        super()._refresh_reports()
        reports = {backend.name: backend.load.report for backend in self.backends}
        self.recording.events.append((self.now, "report", reports))

    def _send_to(
        self, backend: SimBackend, ticket: RouteTicket | None, uncached: int, kv_blocks: int, prompt_tokens: int
    ) -> Settle:
        assert ticket is not None
        request_id = ticket.request.request_id
        self.recording.placed[request_id] = (backend.name, str(ticket.decision.reason))
        return _Recorded(super()._send_to(backend, ticket, uncached, kv_blocks, prompt_tokens), request_id, self)


class _Recorded:
    def __init__(self, settle: Settle, request_id: str, fleet: RecordedFleet) -> None:
        self._settle, self._request_id, self._fleet = settle, request_id, fleet

    def first_token(self) -> None:
        self._fleet.recording.events.append((self._fleet.now, "first_token", self._request_id))
        self._settle.first_token()

    def finish(self, cached_tokens: int | None, prefilled: bool, completed_output_tokens: int | None = None) -> None:
        self._fleet.recording.events.append((self._fleet.now, "finish", (self._request_id, cached_tokens)))
        self._settle.finish(cached_tokens, prefilled, completed_output_tokens)


class Replay:
    """The gateway's dispatcher over a pool of the same replicas, on the recording's clock."""

    def __init__(self, fleet: SimFleet, routing: dict) -> None:
        self.now = 0.0
        health = HealthConfig(interval_s=fleet.report_interval_s)
        backends = [
            Backend(
                BackendSpec(name=name, url=f"http://{name}.sim.invalid", kv_capacity_blocks=fleet.num_blocks),
                MODEL,
                CircuitBreaker(name, health, self.clock),
                healthy=True,
                load=LoadView(health.report_stale_after_s, self.clock),
            )
            for name in (f"replica-{index}" for index in range(fleet.replicas))
        ]
        specs = [ReplicaSpec(backend.name, MODEL, None, fleet.num_blocks) for backend in backends]
        self.router = Router(RoutingConfig.model_validate(routing), fleet.block_size, specs, clock=self.clock)
        self.pool = BackendPool(backends, health)
        self.dispatcher = Dispatcher(
            self.pool, self.router, AdmissionQueue(10_000, 3600.0), TimeoutsConfig(), fleet.block_size
        )
        self.flights: dict[str, tuple[InFlight, str]] = {}
        self.placed: dict[str, tuple[str, str]] = {}
        self.tasks: list[asyncio.Task] = []

    def clock(self) -> float:
        return self.now

    async def arrive(self, fleet: VirtualFleet, request: BenchRequest) -> None:
        """What ``Dispatcher._dispatch_with_retries`` does up to the send: admit, place, count it sent."""
        route = fleet.route_request(request)
        placement = await self.dispatcher.admit(route, SIM_TENANT, set())
        flight = InFlight(self.router, placement, placement.uncached_tokens)
        flight.sent()
        self.flights[route.request_id] = (flight, placement.backend.name)
        self.placed[route.request_id] = (placement.backend.name, str(placement.decision.reason))

    def first_token(self, request_id: str) -> None:
        """As ``Dispatcher._forward``'s ``first_token``: the prefill is done, the owner's line may move."""
        flight, name = self.flights[request_id]
        flight.first_token()
        self.dispatcher.held.notify(name)

    def finish(self, request_id: str, cached_tokens: int | None) -> None:
        """As ``Dispatcher._forward``'s end: settle, then wake the queue and the owner's line."""
        flight, name = self.flights.pop(request_id)
        flight.finish(cached_tokens, prefilled=True)
        self.dispatcher._freed(name)


async def settle() -> None:
    """Let every task the last event woke run to its next wait (nothing here waits on I/O)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def replay(recording: Recording, fleet: VirtualFleet, routing: dict = ROUTING) -> Replay:
    gateway = Replay(fleet.fleet, routing)
    for at, kind, what in recording.events:
        gateway.now = at
        if kind == "arrive":
            assert isinstance(what, BenchRequest)
            gateway.tasks.append(asyncio.create_task(gateway.arrive(fleet, what)))
        elif kind == "report":
            assert isinstance(what, dict)
            for name, report in what.items():
                assert isinstance(report, ReplicaLoad)
                gateway.pool.backends[name].load.on_report(report)
            gateway.pool._changed()  # the end of a health round (BackendPool.check_all)
        elif kind == "first_token":
            gateway.first_token(str(what))
        else:
            request_id, cached = what  # type: ignore[misc]
            gateway.finish(request_id, cached)
        await settle()
    await asyncio.gather(*gateway.tasks)
    return gateway


@pytest.mark.parametrize(("num_blocks", "seed", "user_rate"), [(96, 5, 24.0), (160, 3, 12.0), (160, 4, 12.0)])
def test_the_simulator_places_every_request_as_the_gateway_does(num_blocks: int, seed: int, user_rate: float) -> None:
    """96 blocks a replica and users arriving fast: requests queue for room; 160: more of them hit
    their cached prefixes."""
    requests = multi_turn(MultiTurnParams(num_users=24, turns=4, user_rate=user_rate, seed=seed))
    recording = Recording()
    fleet = RecordedFleet(recording, fleet_of(num_blocks))
    outcome = fleet.run(requests)
    held = outcome.held
    assert held.held > 0 and held.timed_out == 0, "the workload makes late binding hold spills, none for long"
    assert recording.queued > 0 or num_blocks > 96, "the workload makes requests wait for room"
    gateway = asyncio.run(replay(recording, fleet))
    assert len(gateway.placed) == len(requests) == len(recording.placed)
    mismatches = {
        rid: (sim, gateway.placed[rid]) for rid, sim in recording.placed.items() if sim != gateway.placed[rid]
    }
    assert mismatches == {}
    gateway_held = gateway.dispatcher.held.stats()
    assert (gateway_held.held, gateway_held.released) == (held.held, held.released)
    for backend in gateway.pool.backends.values():
        assert (backend.in_flight, backend.in_flight_prefill_tokens, backend.kv_reserved_blocks) == (0, 0, 0)


def test_the_replay_can_tell_a_different_placement() -> None:
    """The check can fail: a gateway whose router ignores the cache places requests elsewhere."""
    requests = multi_turn(MultiTurnParams(num_users=8, turns=3, user_rate=6.0, seed=1))
    recording = Recording()
    fleet = RecordedFleet(recording, fleet_of(96))
    fleet.run(requests)
    gateway = asyncio.run(replay(recording, fleet, {**ROUTING, "policy": "round_robin"}))
    assert any(recording.placed[rid] != gateway.placed[rid] for rid in recording.placed)
