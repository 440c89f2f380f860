"""P/D fleets in ``bench simulate`` (bench/sim/sim_pd.py): roles, the split's timeline, repeatability."""

from dataclasses import replace

import pytest

from bench.cli import scaled_costs
from bench.harness.contenders import Contender
from bench.sim.sim_pd import PdSetup, PdVirtualFleet, split_roles
from bench.sim.sim_pd_cli import build_parser, policies, seed_summary, transfer_s_per_token
from bench.sim.sim_pd_cli import main as simulate_pd_main
from bench.sim.simulate import SimFleet
from bench.workloads.types import BenchRequest
from engine.sim.sim_runner import SMOLLM2_CPU

COSTS = scaled_costs(SMOLLM2_CPU, 75e-6)
FLEET = SimFleet(replicas=3, num_blocks=512, costs=COSTS)
TRANSFER_S = 2e-5
"""Seconds per token moved: large enough to see in a timeline, far below a token's prefill."""
KVGATE = Contender("kvgate", "cache_aware")
AMONG_BOTH = Contender("kvgate", "cache_aware", routing={"disaggregation": {"among_both": True, "mode": "always"}})
"""kvgate configured to split every request among replicas that are all ``both``."""


def long_prompts(count: int = 12, tokens: int = 1500) -> list[BenchRequest]:
    """Distinct long prompts, one every 0.2 s, 16 output tokens each."""
    return [
        BenchRequest(f"r{i}", f"r{i}", 0.2 * i, 16, prompt_ids=tuple(100_000 * (i + 1) + t for t in range(tokens)))
        for i in range(count)
    ]


def run(
    decider: str, prefill: int = 1, requests: list[BenchRequest] | None = None, contender: Contender = KVGATE
) -> PdVirtualFleet:
    fleet = PdVirtualFleet(contender, FLEET, PdSetup(split_roles(3, prefill), decider, TRANSFER_S))
    outcome = fleet.run(requests or long_prompts())
    assert all(result.ok for result in outcome.load.results)
    for backend in fleet.backends:
        manager = backend.replica.block_manager
        manager.assert_invariants()
        assert manager.num_free_blocks == manager.num_blocks, "no block leaked"
        assert backend.in_flight == backend.in_flight_prefill_tokens == backend.kv_reserved_blocks == 0
    return fleet


def test_always_splits_every_request_onto_the_roles() -> None:
    fleet = run("always")
    assert fleet.pd.split == len(long_prompts()) and fleet.pd.local == 0
    assert {leg.prefill for leg in fleet.pd.legs.values()} == {"replica-0"}
    assert {leg.decode for leg in fleet.pd.legs.values()} <= {"replica-1", "replica-2"}
    assert fleet.backends[0].replica.served == len(long_prompts()), "the prefill replica ran every prefill leg"


def test_a_split_requests_timeline_includes_the_prefill_leg_and_the_transfer() -> None:
    requests = long_prompts()
    fleet = PdVirtualFleet(KVGATE, FLEET, PdSetup(split_roles(3, 1), "always", TRANSFER_S))
    results = {result.request_id: result for result in fleet.run(requests).load.results}
    for request in requests:
        leg, result = fleet.pd.legs[request.request_id], results[request.request_id]
        assert leg.moved_blocks == (len(request.prompt_ids or ()) - 1) // 16, "a cold decode replica pulls every block"
        assert leg.transfer_s == pytest.approx(leg.moved_blocks * 16 * TRANSFER_S)
        assert result.ttft_s is not None
        assert result.start_s + result.ttft_s >= leg.prefill_done_s + leg.transfer_s
        assert result.cached_tokens == leg.moved_blocks * 16, "the decode leg hits the pulled blocks"
        assert result.backend == leg.decode and f"prefill={leg.prefill}" in (result.route_reason or "")


def test_the_decode_replica_pulls_only_the_blocks_it_lacks() -> None:
    first = long_prompts(1)[0]
    follow_up = BenchRequest("r1", "r1", 5.0, 16, prompt_ids=(first.prompt_ids or ()) + tuple(range(7, 807)))
    fleet = run("always", requests=[first, follow_up])
    legs = fleet.pd.legs
    assert legs["r0"].decode == legs["r1"].decode, "the follow-up decodes where its prefix is"
    assert legs["r1"].moved_blocks == (len(follow_up.prompt_ids or ()) - 1) // 16 - legs["r0"].moved_blocks


def test_kvgate_conditional_splits_long_cold_prompts_and_keeps_warm_follow_ups_local() -> None:
    first = long_prompts(1)[0]
    follow_up = BenchRequest("r1", "r1", 5.0, 16, prompt_ids=(first.prompt_ids or ()) + tuple(range(7, 47)))
    fleet = run("kvgate", requests=[first, follow_up])
    assert set(fleet.pd.legs) == {"r0"}
    assert fleet.pd.local == 1


def test_aggregated_never_splits_and_peers_follow_their_thresholds() -> None:
    assert run("never", prefill=0).pd.split == 0
    short = [BenchRequest(f"s{i}", f"s{i}", 0.1 * i, 8, prompt_ids=tuple(range(i, i + 200))) for i in range(6)]
    assert run("llm-d", requests=short).pd.split == 0
    assert run("llm-d").pd.split == len(long_prompts())
    assert run("dynamo", requests=short).pd.split == 0
    assert run("dynamo").pd.split > 0


def test_a_fleet_of_both_replicas_splits_only_with_among_both_as_the_gateway_does() -> None:
    off = PdVirtualFleet(KVGATE, FLEET, PdSetup(split_roles(3, 0), "kvgate", TRANSFER_S))
    results = off.run(long_prompts()).load.results
    assert off.pd.split == 0 and off.pd.local == len(results) == len(long_prompts())
    assert all("pd-off" in (result.route_reason or "") for result in results)
    assert run("kvgate", prefill=0, contender=AMONG_BOTH).pd.split == len(long_prompts())


def test_a_mixed_fleet_prefills_legs_on_its_prefill_replica_and_decodes_on_the_both_ones() -> None:
    """1 ``prefill`` + 2 ``both`` (``--conditional-mixed 1``): the prefill replica serves no client
    request, and long cold prompts arriving faster than one replica prefills them split onto it."""
    roles = split_roles(3, 1, "both")
    assert roles == ("prefill", "both", "both")
    fleet = PdVirtualFleet(KVGATE, FLEET, PdSetup(roles, "kvgate", TRANSFER_S))
    burst = [replace(request, arrival_s=request.arrival_s / 4) for request in long_prompts(count=20)]
    results = fleet.run(burst).load.results
    assert all(result.ok for result in results)
    assert {result.backend for result in results} <= {"replica-1", "replica-2"}
    assert 0 < fleet.pd.split < len(burst)
    assert {leg.prefill for leg in fleet.pd.legs.values()} == {"replica-0"}
    for backend in fleet.backends:
        assert backend.in_flight == backend.kv_reserved_blocks == 0
        assert backend.replica.block_manager.num_free_blocks == backend.replica.block_manager.num_blocks


def test_a_split_follow_up_decodes_on_the_idle_replica_when_the_one_holding_its_prefix_is_decoding() -> None:
    """gateway/routing/pd_decode.py as the gateway runs it: the follow-up's prefix is on the replica
    decoding the first request, where the router places it; split, it prefills nothing there, and
    with a fast link the idle decode replica, which lacks the prefix, serves it sooner."""
    document = tuple(range(100_000, 101_500))
    first = BenchRequest("first", "first", 0.0, 200, prompt_ids=document)
    follow_up = BenchRequest("follow-up", "follow-up", 0.15, 16, prompt_ids=(*document, *range(200_000, 201_000)))
    fleet = PdVirtualFleet(KVGATE, FLEET, PdSetup(split_roles(3, 1), "kvgate", 1e-7))
    results = {result.request_id: result for result in fleet.run([first, follow_up]).load.results}
    assert results["first"].backend == "replica-1" and (results["first"].route_reason or "").startswith(
        "no-match pd-split"
    )
    assert results["follow-up"].backend == fleet.pd.legs["follow-up"].decode == "replica-2"
    assert (results["follow-up"].route_reason or "").startswith("pd-decode-cost pd-split: est ")
    assert fleet.pd.legs["follow-up"].moved_blocks == (len(document) + 1000) // FLEET.block_size, "it held none"
    for backend in fleet.backends:
        assert backend.in_flight == backend.kv_reserved_blocks == 0
        assert backend.replica.block_manager.num_free_blocks == backend.replica.block_manager.num_blocks


def test_past_capacity_a_mixed_fleets_prefill_replica_serves_clients_only_with_overflow_set() -> None:
    """``disaggregation.prefill_overflow_s`` (gateway/routing/prefill_overflow.py): a burst of long
    prompts queues more than 0.5 s of prefill on both ``both`` replicas, so the prefill replica takes
    client requests too; without the setting it never does."""
    burst = [replace(request, arrival_s=request.arrival_s / 20) for request in long_prompts(count=30)]
    served: dict[float | None, int] = {}
    for limit in (None, 0.5):
        routing = {"disaggregation": {"prefill_overflow_s": limit}}
        contender = Contender("kvgate", "cache_aware", routing=routing)
        fleet = PdVirtualFleet(contender, FLEET, PdSetup(split_roles(3, 1, "both"), "kvgate", TRANSFER_S))
        results = fleet.run(burst).load.results
        assert all(result.ok for result in results)
        served[limit] = sum(result.backend == "replica-0" for result in results)
        for backend in fleet.backends:
            assert backend.in_flight == backend.kv_reserved_blocks == 0
            assert backend.replica.block_manager.num_free_blocks == backend.replica.block_manager.num_blocks
    assert served[None] == 0
    assert 0 < served[0.5] < len(burst)


def test_the_command_names_a_mixed_fleet_by_its_roles() -> None:
    args = build_parser().parse_args(["--replicas", "8", "--conditional-splits", "0", "--conditional-mixed", "1"])
    conditional = [policy for policy in policies(args) if policy.decider == "kvgate"]
    assert [policy.name for policy in conditional] == ["kvgate conditional all both", "kvgate conditional 1P:7B"]
    assert conditional[1].roles(8) == ("prefill",) + ("both",) * 7
    with pytest.raises(ValueError, match="decode or both"):
        split_roles(3, 1, "prefill")


def test_runs_are_exactly_repeatable() -> None:
    def timings() -> list[tuple[str, float | None, str | None]]:
        fleet = PdVirtualFleet(AMONG_BOTH, FLEET, PdSetup(split_roles(3, 0), "kvgate", TRANSFER_S))
        return [(r.request_id, r.ttft_s, r.route_reason) for r in fleet.run(long_prompts()).load.results]

    first = timings()
    assert first == timings() and all("prefill=" in (reason or "") for _, _, reason in first)


def test_roles_are_checked() -> None:
    with pytest.raises(ValueError, match="one role"):
        PdVirtualFleet(KVGATE, FLEET, PdSetup(("both", "both"), "kvgate", TRANSFER_S))
    with pytest.raises(ValueError, match="serve nothing"):
        PdVirtualFleet(KVGATE, FLEET, PdSetup(split_roles(3, 1), "never", TRANSFER_S))
    with pytest.raises(ValueError, match="decode replica"):
        split_roles(3, 3)


def test_transfer_cost_comes_from_the_planner() -> None:
    assert transfer_s_per_token("llama-3-8b-h100", 25.0) == pytest.approx(131_072 / 25e9)
    assert transfer_s_per_token("llama-3-70b-h100-tp4", 25.0) == pytest.approx(327_680 / 100e9)


def test_the_command_skips_without_the_trace(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_pd_main(["--trace-dir", str(tmp_path)]) == 0
    assert "skipping" in capsys.readouterr().out


def test_answers_end_at_their_own_length_under_a_loose_client_bound_and_the_router_learns_how_short() -> None:
    """``SimFleet.client_max_tokens``: clients send 4,096 while each answer stops (an EOS) at its own
    16 tokens, split or local; the router records each completed answer against the loose bound."""
    loose = SimFleet(replicas=3, num_blocks=512, costs=COSTS, client_max_tokens=4096)
    fleet = PdVirtualFleet(KVGATE, loose, PdSetup(split_roles(3, 1), "kvgate", TRANSFER_S))
    outcome = fleet.run(long_prompts(count=40))
    assert all(result.ok and result.output_tokens == 16 for result in outcome.load.results)
    assert fleet.pd.split > 0, "long cold prompts split: both paths record"
    assert fleet.router is not None
    lengths = fleet.router.output_lengths
    assert len(lengths) == 40, "decode answers only: the prefill legs' one token is not an answer"
    assert lengths.fraction_shorter(1, 4096, 17) == 1.0
    assert lengths.fraction_shorter(1, 4096, 16) == 0.0


def test_a_queued_request_reports_the_clients_loose_bound_not_its_own_length() -> None:
    loose = SimFleet(replicas=3, num_blocks=512, costs=COSTS, client_max_tokens=4096)
    fleet = PdVirtualFleet(KVGATE, loose, PdSetup(split_roles(3, 0), "never", TRANSFER_S))
    seen: list[int] = []
    replica = fleet.backends[0].replica
    original = replica.start_step

    def start_step(now: float) -> float | None:
        seen.extend(decode.tokens + decode.tokens_left for decode in replica.decodes())
        return original(now)

    replica.start_step = start_step  # type: ignore[method-assign]
    fleet.run(long_prompts(count=3))
    assert seen and set(seen) == {4096}


def test_over_seeds_each_window_is_judged_by_its_paired_difference_from_the_better_bar() -> None:
    windows = {
        0: [
            {"aggregated": 90.0, "always 2P:6D": 10.0, "kvgate conditional all both": 85.0},
            {"aggregated": 91.0, "always 2P:6D": 11.0, "kvgate conditional all both": 87.0},
            {"aggregated": 92.0, "always 2P:6D": 12.0, "kvgate conditional all both": 86.0},
        ],
        400: [
            {"aggregated": 40.0, "always 2P:6D": 50.0, "kvgate conditional all both": 52.0},
            {"aggregated": 41.0, "always 2P:6D": 50.0, "kvgate conditional all both": 49.0},
        ],
    }
    header, _, behind, level = seed_summary(windows)
    assert "95 % interval" in header
    assert behind.startswith("| 0 | 3 | aggregated | kvgate conditional all both | -5.0 [")
    assert behind.endswith("| behind |")
    assert level.startswith("| 400 | 2 | always 2P:6D | kvgate conditional all both | +0.5 [")
    assert level.endswith("| level |"), "the paired differences +2 and -1 straddle 0"
