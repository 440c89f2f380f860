"""``kvgate bench simulate``: the real router and engine parts on a virtual clock."""

from bench.cli import scaled_costs
from bench.harness.contenders import Contender
from bench.sim.simulate import SimFleet, VirtualFleet
from bench.workloads.multi_turn import MultiTurnParams
from bench.workloads.multi_turn import generate as multi_turn
from bench.workloads.shared_prefix import SharedPrefixParams
from bench.workloads.shared_prefix import generate as shared_prefix
from engine.sim.sim_runner import SMOLLM2_CPU

COSTS = scaled_costs(SMOLLM2_CPU, 75e-6)
REQUESTS = shared_prefix(SharedPrefixParams(num_groups=8, prompts_per_group=6, system_prompt_len=512, request_rate=40))


def test_every_request_finishes_and_every_replica_ends_with_all_blocks_free() -> None:
    fleet = VirtualFleet(Contender("kvgate", "cache_aware"), SimFleet(replicas=3, num_blocks=256, costs=COSTS))
    outcome = fleet.run(REQUESTS)
    assert len(outcome.load.results) == len(REQUESTS) and all(r.ok for r in outcome.load.results)
    assert sum(outcome.served) == len(REQUESTS)
    assert all(r.output_tokens == 16 and r.ttft_s is not None and r.ttft_s > 0 for r in outcome.load.results)
    for backend in fleet.backends:
        manager = backend.replica.block_manager
        manager.assert_invariants()
        assert manager.num_free_blocks == manager.num_blocks, "no block leaked"
        assert backend.in_flight == backend.in_flight_prefill_tokens == backend.kv_reserved_blocks == 0


def test_the_router_index_follows_the_replicas_kv_events_exactly() -> None:
    fleet = VirtualFleet(Contender("kvgate", "cache_aware"), SimFleet(replicas=3, num_blocks=256, costs=COSTS))
    fleet.run(REQUESTS)
    assert fleet.router is not None
    index = fleet.router.tracker.index
    for backend in fleet.backends:
        assert index.blocks(backend.replica.name) == backend.replica.block_manager.num_cached_blocks > 0


def test_runs_are_exactly_repeatable() -> None:
    def timings() -> list[tuple[str | None, float | None, int]]:
        fleet = VirtualFleet(Contender("kvgate", "cache_aware"), SimFleet(replicas=3, num_blocks=256, costs=COSTS))
        return [(r.backend, r.ttft_s, r.cached_tokens) for r in fleet.run(REQUESTS).load.results]

    assert timings() == timings()


def test_cache_aware_beats_direct_round_robin_on_hits_and_ttft() -> None:
    fleet = SimFleet(replicas=4, num_blocks=256, costs=COSTS)
    aware = VirtualFleet(Contender("kvgate", "cache_aware"), fleet).run(REQUESTS).load.results
    direct = VirtualFleet(Contender("direct", "round_robin"), fleet).run(REQUESTS).load.results

    def hits(results: list) -> float:
        return sum(r.cached_tokens for r in results) / sum(r.prompt_tokens for r in results)

    assert hits(aware) > hits(direct) + 0.2
    assert sorted(r.ttft_s for r in aware)[len(aware) // 2] < sorted(r.ttft_s for r in direct)[len(direct) // 2]


def test_sessions_send_their_next_turn_after_the_previous_one_ends() -> None:
    requests = multi_turn(MultiTurnParams(num_users=3, turns=3, system_prompt_len=128, think_s=0.2))
    results = VirtualFleet(Contender("kvgate", "session"), SimFleet(replicas=2, num_blocks=256, costs=COSTS)).run(
        requests
    )
    by_id = {r.request_id: r for r in results.load.results}
    for user in range(3):
        for turn in (1, 2):
            before, after = by_id[f"mt-{user}-{turn - 1}"], by_id[f"mt-{user}-{turn}"]
            assert before.e2e_s is not None
            assert after.start_s >= before.start_s + before.e2e_s + 0.2 - 1e-9
            assert after.backend == before.backend and after.route_reason == "session"
            assert after.cached_tokens > 0


def test_late_binding_holds_spills_for_their_owners_and_every_request_still_finishes() -> None:
    late = Contender(
        "kvgate", "cache_aware", {"ttft_target_s": 0.05, "late_binding": {"enabled": True, "max_wait_s": 0.5}}
    )
    # Holds need load spills: with the gateway's own count of queued prefill (no load reports) this
    # small workload makes two; with the replicas' exact count it makes none.
    fleet = VirtualFleet(late, SimFleet(replicas=3, num_blocks=256, costs=COSTS, load_reports=False))
    outcome = fleet.run(REQUESTS)
    held = outcome.held
    assert held.held > 0 and held.released + held.timed_out == held.held, "each held request left the hold once"
    assert len(outcome.load.results) == len(REQUESTS) and all(r.ok for r in outcome.load.results)
    assert len(fleet._holds) == 0 and held.held_by_owner == {}
    for backend in fleet.backends:
        backend.replica.scheduler.assert_invariants()
        assert backend.in_flight == backend.kv_reserved_blocks == 0


def test_a_host_tier_turns_device_evictions_into_host_hits_and_leaks_nothing() -> None:
    def run(host_blocks: int) -> tuple[VirtualFleet, float]:
        fleet = VirtualFleet(
            Contender("kvgate", "cache_aware"),
            SimFleet(replicas=2, num_blocks=96, costs=COSTS, host_blocks=host_blocks),
        )
        outcome = fleet.run(REQUESTS)
        assert all(r.ok for r in outcome.load.results)
        cached = sum(r.cached_tokens for r in outcome.load.results)
        return fleet, cached / sum(r.prompt_tokens for r in outcome.load.results)

    _, device_only = run(0)
    with_host, tiered = run(512)
    assert sum(b.replica.block_manager.num_host_hit_blocks for b in with_host.backends) > 0
    assert tiered > device_only, "blocks evicted from the small device pools come back from host memory"
    for backend in with_host.backends:
        manager = backend.replica.block_manager
        manager.assert_invariants()
        assert manager.num_free_blocks == manager.num_blocks


def test_the_router_reads_load_as_the_replicas_load_socket_sends_it() -> None:
    """With load reports, routing sees the scheduler's count (a queued follow-up counts whole, as
    the engine reports it in ``bench run``); without, only the gateway's own count."""
    for load_reports in (True, False):
        fleet = VirtualFleet(
            Contender("kvgate", "cache_aware"),
            SimFleet(replicas=1, num_blocks=256, costs=COSTS, load_reports=load_reports),
        )
        backend = fleet.backends[0]
        first_turn = list(range(100, 164))
        backend.replica.add(first_turn, 1, 0.0, lambda now: None, lambda request, now: None)
        while backend.replica.scheduler.has_work:
            backend.replica.start_step(0.0)
            backend.replica.finish_step(0.0)
        backend.replica.add([*first_turn, 1, 2, 3], 1, 0.0, lambda now: None, lambda request, now: None)
        state = backend.state()
        if load_reports:
            assert (state.num_waiting, state.queued_prefill_tokens) == (1, 67)
        else:
            # The gateway's load view without a fresh report: its own requests (none were sent through it).
            assert (state.num_running, state.num_waiting, state.queued_prefill_tokens) == (0, 0, 0)
