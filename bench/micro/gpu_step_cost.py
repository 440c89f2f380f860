"""What a step of a GPU preset's model costs on the GPU here, beside what the preset charges for it.

The roofline presets of ``bench simulate`` (engine/sim/sim_presets.py) were fitted to published
vLLM figures. This measures them: it builds a decoder of the preset model's shapes in plain
PyTorch (random bf16 weights, since timings do not depend on values; cuBLAS GEMMs; SDPA's fused
attention; every step replayed from a CUDA graph, as vLLM runs them) and times the step shapes
the simulator prices, printing each beside ``SimCosts.step_seconds`` of the preset:

- a prefill of N new tokens after C cached ones (one sequence);
- a decode step of B sequences, each at context L.

Plain PyTorch has no fused norms, rotary or activation kernels and a contiguous KV cache instead
of a paged one, so a tuned engine is somewhat faster than this; a measured step well under the
preset's means the preset is pessimistic, one well over it that the preset is optimistic.
A tensor-parallel preset is measured on one GPU of its group: that GPU's shard of every layer
(its heads, KV heads, MLP columns and vocabulary slice), the preset's charge for the two
all-reduces per layer taken out of the comparison (one GPU does none; the preset's all-reduce
cost is printed).

Run: ``kvgate bench gpu-step-cost --preset llama-3-8b-h200 [--out FILE.json]`` (or ``python -m bench.micro.gpu_step_cost``)
(``--device cpu --layers 2`` checks the script itself on a CPU, timings meaningless).
"""

import argparse
import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import orjson
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from engine.model.runner_api import SamplingParams, SeqChunk
from engine.sim.sim_presets import GPU_PRESETS
from planner.load import load_arch
from planner.parallel import Parallelism, gpu_shard, params_per_gpu


@dataclass(frozen=True)
class DenseShapes:
    """What the planner's architecture leaves out: the MLP and vocabulary widths."""

    hidden: int
    intermediate: int
    vocab: int


DENSE_SHAPES = {
    "llama-3-8b": DenseShapes(hidden=4096, intermediate=14336, vocab=128256),
    "llama-3-70b": DenseShapes(hidden=8192, intermediate=28672, vocab=128256),
}
"""From each model's config.json (meta-llama/Meta-Llama-3-8B, -70B); checked against the planner's parameter count."""


@dataclass(frozen=True)
class Shapes:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dense: DenseShapes


@dataclass(frozen=True)
class StepRow:
    step: str
    measured_ms: float
    preset_ms: float


class Decoder:
    """A Llama decoder's arithmetic: fused QKV and gate-up GEMMs, RMSNorm, rotary, GQA attention."""

    def __init__(self, shapes: Shapes, device: torch.device) -> None:
        self.shapes = shapes
        hidden, inter = shapes.dense.hidden, shapes.dense.intermediate
        qkv = (shapes.heads + 2 * shapes.kv_heads) * shapes.head_dim

        def weight(*size: int) -> torch.Tensor:
            return torch.randn(*size, device=device, dtype=torch.bfloat16) * 0.02

        self.embed = weight(shapes.dense.vocab, hidden)
        self.lm_head = weight(hidden, shapes.dense.vocab)
        self.layers = [
            (
                weight(hidden, qkv),
                weight(shapes.heads * shapes.head_dim, hidden),
                weight(hidden, 2 * inter),
                weight(inter, hidden),
            )
            for _ in range(shapes.layers)
        ]
        self.norm = torch.ones(hidden, device=device, dtype=torch.bfloat16)
        exponents = torch.arange(0, shapes.head_dim, 2, device=device).float() / shapes.head_dim
        self.inverse_freq = 1.0 / (500_000.0**exponents)

    def parameters(self) -> int:
        tensors = [self.embed, self.lm_head, *(w for layer in self.layers for w in layer)]
        return sum(t.numel() for t in tensors)

    def rms(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.norm

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float()[:, None] * self.inverse_freq[None, :]
        cos, sin = angles.cos().to(x.dtype)[None, None], angles.sin().to(x.dtype)[None, None]
        first, second = x[..., ::2], x[..., 1::2]
        return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """``tokens`` [batch, new]; each cache [batch, kv_heads, start + new, head_dim], its last ``new`` slots written here."""
        s = self.shapes
        batch, new = tokens.shape
        x = self.embed[tokens]
        for (w_qkv, w_o, w_gate_up, w_down), (k_cache, v_cache) in zip(self.layers, caches, strict=True):
            q, k, v = (self.rms(x) @ w_qkv).split(
                [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
            )
            q = self.rotate(q.view(batch, new, s.heads, s.head_dim).transpose(1, 2), positions)
            k = self.rotate(k.view(batch, new, s.kv_heads, s.head_dim).transpose(1, 2), positions)
            k_cache[:, :, -new:] = k
            v_cache[:, :, -new:] = v.view(batch, new, s.kv_heads, s.head_dim).transpose(1, 2)
            total = k_cache.shape[2]
            mask = causal_lower_right(new, total) if new > 1 else None
            attended = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
            x = x + attended.transpose(1, 2).reshape(batch, new, -1) @ w_o
            gate, up = (self.rms(x) @ w_gate_up).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w_down
        return self.rms(x[:, -1]) @ self.lm_head


def kv_caches(shapes: Shapes, batch: int, length: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    size = (batch, shapes.kv_heads, length, shapes.head_dim)
    return [
        (torch.randn(size, device=device, dtype=torch.bfloat16), torch.randn(size, device=device, dtype=torch.bfloat16))
        for _ in range(shapes.layers)
    ]


def timed_ms(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls after two warm-ups."""
    for _ in range(2):
        run()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            samples.append((time.perf_counter() - began) * 1e3)
    return statistics.median(samples)


@torch.inference_mode()
def step_ms(model: Decoder, batch: int, new: int, cached: int, device: torch.device, repeats: int) -> float:
    """One step of ``batch`` sequences computing ``new`` tokens each after ``cached`` ones.

    On a GPU the step is captured once and replayed from a CUDA graph, as vLLM runs decode steps
    (and, with piecewise graphs, prefills): plain PyTorch's kernel launches would otherwise
    dominate every step shorter than a few tens of milliseconds."""
    caches = kv_caches(model.shapes, batch, cached + new, device)
    tokens = torch.randint(0, model.shapes.dense.vocab, (batch, new), device=device)
    positions = torch.arange(cached, cached + new, device=device)
    if device.type != "cuda":
        return timed_ms(lambda: model.forward(tokens, positions, caches), device, repeats)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        model.forward(tokens, positions, caches)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.forward(tokens, positions, caches)
    return timed_ms(graph.replay, device, repeats)


def allreduce_ms(preset: str) -> float:
    """What the preset charges a step for its all-reduces (none without TP)."""
    return GPU_PRESETS[preset].allreduces_s() * 1e3


def predicted_ms(preset: str, chunks: list[SeqChunk]) -> float:
    """The preset's step, less its all-reduces (which one GPU does not run)."""
    return GPU_PRESETS[preset].costs().step_seconds(chunks) * 1e3 - allreduce_ms(preset)


def chunk(new: int, start: int) -> SeqChunk:
    return SeqChunk(0, [0] * new, start, [], sample=True, sampling=SamplingParams())


def shapes_of(preset: str, layers: int | None) -> Shapes:
    """One GPU's shard of the preset's model (the whole model without TP)."""
    spec = GPU_PRESETS[preset]
    arch = load_arch(spec.model)
    if spec.model not in DENSE_SHAPES:
        raise SystemExit(f"{preset}: no dense shapes for {spec.model} (add them to DENSE_SHAPES)")
    tp = spec.tensor_parallel
    shard = gpu_shard(arch, Parallelism(tensor=tp), 0)
    dense = DENSE_SHAPES[spec.model]
    sharded = DenseShapes(dense.hidden, dense.intermediate // tp, dense.vocab // tp)
    return Shapes(layers or arch.num_layers, shard.num_attention_heads, shard.num_kv_heads, arch.head_dim, sharded)


def planner_parameters(preset: str, layers: int) -> int:
    """The planner's parameters for one GPU of the preset, without norms (the decoder's weights)."""
    spec = GPU_PRESETS[preset]
    arch = load_arch(spec.model)
    assert arch.params is not None
    counts = dataclasses.replace(arch.params, layers=arch.params.layers[:layers], final_norm=0)
    trimmed = dataclasses.replace(arch, num_layers=layers, layer_windows=arch.layer_windows[:layers])
    norms = sum(layer.replicated for layer in counts.layers)
    return params_per_gpu(trimmed, counts, Parallelism(tensor=spec.tensor_parallel), 0) - norms


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-3-8b-h200", choices=sorted(GPU_PRESETS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, help="fewer layers than the model's (a check of the script only)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill", default="256:0,1024:0,4096:0,8192:0,1024:4096,512:7680", help="NEW:CACHED,...")
    parser.add_argument("--decode", default="1:512,8:512,32:512,64:1024,128:1024,256:512,256:2048",
                        help="BATCH:CONTEXT,...")  # fmt: skip
    parser.add_argument("--out", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    shapes = shapes_of(args.preset, args.layers)
    model = Decoder(shapes, device)
    expected = planner_parameters(args.preset, shapes.layers)
    assert model.parameters() == expected, f"shapes give {model.parameters():,} parameters, the planner {expected:,}"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    tp = GPU_PRESETS[args.preset].tensor_parallel
    print(f"{args.preset} on {gpu}: {model.parameters() / 1e9:.2f} B parameters on this GPU (1 of {tp}), "
          f"{shapes.layers} layers, bf16; the preset's {allreduce_ms(args.preset):.1f} ms of all-reduces a step left out")  # fmt: skip
    rows: list[StepRow] = []
    for spec in args.prefill.split(","):
        new, cached = (int(part) for part in spec.split(":"))
        measured = step_ms(model, 1, new, cached, device, args.repeats)
        rows.append(StepRow(f"prefill {new} after {cached}", measured, predicted_ms(args.preset, [chunk(new, cached)])))
    for spec in args.decode.split(","):
        batch, context = (int(part) for part in spec.split(":"))
        measured = step_ms(model, batch, 1, context, device, args.repeats)
        preset = predicted_ms(args.preset, [chunk(1, context)] * batch)
        rows.append(StepRow(f"decode {batch} x {context}", measured, preset))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"{'step':<30}{'measured ms':>14}{'preset ms':>12}{'preset/measured':>17}")
    for row in rows:
        ratio = row.preset_ms / row.measured_ms if row.measured_ms > 0 else math.nan
        print(f"{row.step:<30}{row.measured_ms:>14.2f}{row.preset_ms:>12.2f}{ratio:>17.2f}")
    if args.out:
        with open(args.out, "wb") as out:
            out.write(
                orjson.dumps(
                    {"preset": args.preset, "gpu": gpu, "layers": shapes.layers, "rows": [asdict(row) for row in rows]}
                )
            )


if __name__ == "__main__":
    main()
