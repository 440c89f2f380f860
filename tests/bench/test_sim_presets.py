"""The GPU roofline presets against the published vLLM figures their docstring cites."""

import pytest

from bench.harness.contenders import Contender
from bench.sim.peer_models import MODELLED_PEERS
from bench.sim.simulate import SimFleet, VirtualFleet
from engine.model.runner_api import SamplingParams, SeqChunk
from engine.sim.sim_presets import GPU_PRESETS, H100_SXM, GpuPreset, preset_costs
from engine.sim.sim_runner import SMOLLM2_CPU, SimCosts
from tests.bench.test_simulate import REQUESTS


def decode_step(costs: SimCosts, batch: int, context: int) -> float:
    return costs.step_seconds([SeqChunk(i, [1], context, [], True, SamplingParams()) for i in range(batch)])


def latency_test_s(costs: SimCosts) -> float:
    """vLLM's dashboard latency test: a batch of 8, 32 prompt tokens, 128 output tokens."""
    prefill = costs.step_seconds([SeqChunk(i, [1] * 32, 0, [], True, SamplingParams()) for i in range(8)])
    return prefill + sum(decode_step(costs, 8, 32 + step) for step in range(127))


@pytest.mark.parametrize(("preset", "published_s"), [("llama-3-8b-h200", 0.833), ("llama-3-70b-h200-tp4", 2.078)])
def test_h200_presets_match_vllms_latency_dashboard_within_10_percent(preset: str, published_s: float) -> None:
    assert latency_test_s(preset_costs(preset)) == pytest.approx(published_s, rel=0.10)


def test_h100_full_batch_throughput_is_near_the_published_12500_tokens_per_s() -> None:
    assert 256 / decode_step(preset_costs("llama-3-8b-h100"), 256, 512) == pytest.approx(12_500, rel=0.15)


def test_gpu_decode_is_nearly_flat_in_the_batch_unlike_the_cpu_preset() -> None:
    gpu = preset_costs("llama-3-8b-h100")
    assert decode_step(gpu, 32, 1024) / decode_step(gpu, 1, 1024) < 1.5
    assert decode_step(SMOLLM2_CPU, 32, 1024) / decode_step(SMOLLM2_CPU, 1, 1024) > 5
    one_prefill = 1000 * gpu.prefill_per_token_s + gpu.step_overhead_s
    assert one_prefill / decode_step(gpu, 1, 1024) < 10, "a 1,000-token prefill: a few decode steps, not 180"


def test_tensor_parallel_splits_flops_and_kv_reads_across_gpus() -> None:
    tp1 = GpuPreset("llama-3-70b", H100_SXM).costs()
    tp4 = GPU_PRESETS["llama-3-70b-h100-tp4"].costs()
    assert tp4.prefill_per_token_s == pytest.approx(tp1.prefill_per_token_s / 4, rel=0.01)
    assert tp4.decode_per_context_token_s == pytest.approx(tp1.decode_per_context_token_s / 4)
    assert tp1.step_overhead_s / 4 < tp4.step_overhead_s < tp1.step_overhead_s, "weights split, all-reduces added"
    assert GpuPreset("llama-3-70b", H100_SXM).kv_blocks(16) == 0, "70B does not fit one 80 GB card"
    assert GPU_PRESETS["llama-3-70b-h100-tp4"].kv_blocks(16) > 10_000


@pytest.mark.parametrize("preset", ["llama-3-8b-h100", "llama-3-70b-h100-tp4"])
def test_gpu_presets_run_an_eight_replica_fleet_behind_kvgate_and_every_modelled_peer(preset: str) -> None:
    fleet = SimFleet(replicas=8, num_blocks=GPU_PRESETS[preset].kv_blocks(16), costs=preset_costs(preset))
    for contender in (Contender("kvgate", "cache_aware"), *MODELLED_PEERS):
        results = VirtualFleet(contender, fleet).run(REQUESTS).load.results
        assert len(results) == len(REQUESTS) and all(r.ok for r in results), contender.name
        assert sum(r.cached_tokens for r in results) > 0, contender.name
