"""GPU-shaped sim cost models: roofline presets computed from the planner's arithmetic.

``smollm2-cpu`` (engine/sim/sim_runner.py) has the shape of a CPU: prefill is dear and a decode
step grows almost linearly with the batch. On a datacenter GPU a decode step is bound by
reading the weights and is nearly flat in the batch, and prefill is 10-100x cheaper relative
to it. These presets put that shape into ``SimCosts``:

- a step reads every weight once: ``step_overhead_s`` = weight bytes per GPU / (HBM bandwidth x
  ``bandwidth_eff``) + a fixed launch/scheduling cost + (TP > 1) two all-reduces per layer;
- a prefill token costs 2 x parameters FLOPs (per GPU: / TP) at ``prefill_mfu`` of peak, plus
  4 x layers x heads x head_dim FLOPs per cached context token (attention) at ``attention_eff``;
- a decode sequence costs its 2 x parameters FLOPs at ``decode_mfu`` and reads its KV
  (planner's bytes per token) at ``bandwidth_eff``.

Costs add where a roofline would take a maximum, so a step near the compute/bandwidth knee is
overestimated by up to that overlap; far from it (small-batch decode, long prefill) they agree.
Parameters, weight and KV bytes come from ``planner`` (``load_arch``, ``params_per_gpu``,
``weights_bytes_per_gpu``, ``gpu_shard``, ``kv_bytes_per_token``, ``replica_blocks``): one GPU
of a TP group, as vLLM shards it.

Checked against published vLLM figures (``tests/bench/test_sim_presets.py`` asserts them):

- vLLM's performance dashboard (buildkite.com/vllm/performance-benchmark/builds/9515, latency
  tests: 32 prompt tokens, 128 output tokens, batch 8, on H200): Llama-3.1-8B TP=1 833 ms,
  Llama-3-70B TP=4 2,078 ms per batch. These presets give 808 ms (-3 %) and 2,051 ms (-1 %).
- Third-party vLLM figures collected at morphllm.com/vllm-benchmarks: Llama-3.1-8B on one H100
  about 12,500 output tok/s at full batch. ``llama-3-8b-h100`` at batch 256, context 512: about
  11,100 tok/s (-11 %: compute and KV reads add here where they overlap on the card).
- John Musgrave's A100 sweep (johnmusgrave.com/p/vllm-throughput-latency-sweep-on): Llama-3.1-8B
  single-stream decode reaches 77 % of the HBM roofline, which is ``bandwidth_eff`` with the
  fixed step cost folded in (0.75 here, plus 1.5 ms a step).

Measured on a lent H200 (2026-12-04, ``python -m bench.micro.gpu_step_cost``: the preset's model, or
one GPU's shard of it, in plain PyTorch, every step replayed from a CUDA graph): ``llama-3-8b-h200``
charges 0.98-1.27x the measured prefills (128-8,192 tokens, up to 7,680 cached) and 0.81-1.25x the
decode steps (1-256 sequences); ``llama-3-70b-h200-tp4``, all-reduces left out, 0.87-1.05x the
prefills and 0.67-1.12x the decode steps, the low end at batches under 64, where unfused plain
PyTorch is slower than the vLLM figures above, which the preset matches;
bench/notes/2026-12-04-h200-cuda-path-and-step-costs.md.
"""

from dataclasses import dataclass

from engine.sim.sim_runner import SIM_PRESETS, SimCosts
from planner.kv_math import kv_bytes_per_token
from planner.load import load_arch
from planner.parallel import Parallelism, gpu_shard, params_per_gpu, replica_blocks, weights_bytes_per_gpu


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_bf16_flops: float
    """Dense bf16 tensor-core FLOP/s (no sparsity)."""
    hbm_bytes_per_s: float
    memory_bytes: int


H100_SXM = Gpu("H100 SXM", 989e12, 3.35e12, 80 * 10**9)
H200 = Gpu("H200", 989e12, 4.8e12, 141 * 10**9)


@dataclass(frozen=True)
class Efficiency:
    prefill_mfu: float = 0.5
    decode_mfu: float = 0.5
    attention_eff: float = 0.4
    bandwidth_eff: float = 0.75
    step_fixed_s: float = 1.5e-3
    """Per-step scheduling, sampling and kernel-launch cost (CUDA graphs on)."""
    allreduce_s: float = 25e-6
    """One small-message all-reduce over NVLink (two per layer with TP > 1)."""


@dataclass(frozen=True)
class GpuPreset:
    model: str
    """A planner preset name."""
    gpu: Gpu
    tensor_parallel: int = 1
    efficiency: Efficiency = Efficiency()
    memory_utilization: float = 0.9
    overhead_bytes_per_gpu: int = 2 * 1024**3
    """Activations, CUDA graphs and allocator slack (the planner's default)."""

    def costs(self) -> SimCosts:
        """Per-GPU arithmetic from the planner (one GPU of the TP group; they run in lockstep)."""
        arch = load_arch(self.model)
        parallel = Parallelism(tensor=self.tensor_parallel)
        if arch.params is None:
            raise ValueError(f"{self.model}: no parameter count ({arch.params_missing})")
        eff, gpu = self.efficiency, self.gpu
        flops_per_token = 2 * params_per_gpu(arch, arch.params, parallel, 0)
        shard = gpu_shard(arch, parallel, 0)
        attention_flops = 4 * arch.num_layers * shard.num_attention_heads * shard.head_dim
        bandwidth = gpu.hbm_bytes_per_s * eff.bandwidth_eff
        weight_read_s = weights_bytes_per_gpu(arch, "bf16", parallel, 0) / bandwidth
        return SimCosts(
            step_overhead_s=weight_read_s + eff.step_fixed_s + self.allreduces_s(),
            prefill_per_token_s=flops_per_token / (gpu.peak_bf16_flops * eff.prefill_mfu),
            prefill_per_token_context_s=attention_flops / (gpu.peak_bf16_flops * eff.attention_eff),
            decode_base_s=0.0,
            decode_per_seq_s=flops_per_token / (gpu.peak_bf16_flops * eff.decode_mfu),
            decode_per_context_token_s=kv_bytes_per_token(shard, "bf16") / bandwidth,
        )

    def allreduces_s(self) -> float:
        """What a step spends in all-reduces: two per layer with TP, none without."""
        if self.tensor_parallel == 1:
            return 0.0
        return 2 * load_arch(self.model).num_layers * self.efficiency.allreduce_s

    def kv_blocks(self, block_size: int) -> int:
        """KV blocks of ``block_size`` tokens the replica holds (the planner's per-GPU budget)."""
        arch = load_arch(self.model)
        parallel = Parallelism(tensor=self.tensor_parallel)
        usable = int(self.gpu.memory_bytes * self.memory_utilization)
        kv_memory = usable - weights_bytes_per_gpu(arch, "bf16", parallel, 0) - self.overhead_bytes_per_gpu
        return replica_blocks(arch, "bf16", block_size, parallel, lambda stage: kv_memory)


GPU_PRESETS: dict[str, GpuPreset] = {
    "llama-3-8b-h100": GpuPreset("llama-3-8b", H100_SXM),
    "llama-3-8b-h200": GpuPreset("llama-3-8b", H200),
    "llama-3-70b-h100-tp4": GpuPreset("llama-3-70b", H100_SXM, tensor_parallel=4),
    "llama-3-70b-h200-tp4": GpuPreset("llama-3-70b", H200, tensor_parallel=4),
}


def preset_costs(name: str) -> SimCosts:
    """Any preset's costs by name: the CPU ones of ``SIM_PRESETS`` or a GPU roofline."""
    if name in SIM_PRESETS:
        return SIM_PRESETS[name]
    if name in GPU_PRESETS:
        return GPU_PRESETS[name].costs()
    raise KeyError(f"unknown sim preset {name!r}; choose from {', '.join(preset_names())}")


def preset_names() -> list[str]:
    return sorted([*SIM_PRESETS, *GPU_PRESETS])
