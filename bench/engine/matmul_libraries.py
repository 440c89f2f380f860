"""How fast MKL and oneDNN multiply the engine's matrices on this CPU, in GFLOP/s.

PyTorch sends a float32 ``mm`` (and ``F.linear``, ``bmm``, and the CPU flash kernel's inner
products) to MKL; ``engine.model.onednn.matmul_nt`` goes to oneDNN. On the AMD EPYC dev VM MKL's float32
products ran at less than half oneDNN's speed, which is why the engine's linear layers and its
float32 prefill attention (``engine.model.matmul_attention``) use oneDNN (``bench/VLLM.md``). On another
CPU (an Intel one, where MKL takes its AVX-512 path) rerun this to see whether that still holds;
the step-level effect is measured by ``bench.engine.step_profile``.

Shapes (SmolLM2-135M): Q·Kᵀ and P·V of one KV head for a cached prompt (384 query rows, i.e. 128
tokens of 3 query heads, over 1,536 keys), and the MLP's up projection for 128 tokens. One thread,
CPU time, median over ``--repeats``.

    python -m bench.engine.matmul_libraries [--dtype float32] [--repeats 200]
"""

import argparse
import statistics
from functools import partial

import torch

from bench.engine.step_profile import cpu_seconds
from engine.model.onednn import matmul_nt

SHAPES = {
    "Q·Kᵀ  [384x64]·[64x1536]": (384, 64, 1536),
    "P·V   [384x1536]·[1536x64]": (384, 1536, 64),
    "up    [128x576]·[576x1536]": (128, 576, 1536),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype}, 1 thread, GFLOP/s (median of {args.repeats})")
    for name, (rows, inner, cols) in SHAPES.items():
        x, weight = torch.randn(rows, inner).to(dtype), torch.randn(cols, inner).to(dtype)
        gflop = 2 * rows * inner * cols / 1e9
        mm = gflop / statistics.median(cpu_seconds(partial(torch.matmul, x, weight.T), args.repeats))
        onednn = gflop / statistics.median(cpu_seconds(partial(matmul_nt, x, weight), args.repeats))
        print(f"{name}: torch.mm {mm:6.1f}   oneDNN {onednn:6.1f}")


if __name__ == "__main__":
    main()
