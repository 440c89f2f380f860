"""oneDNN matrix products on CPU.

PyTorch sends a float32 ``mm``/``bmm``/``F.linear`` (and the CPU flash-attention kernel's inner
products) to MKL, which on the AMD EPYC we measure on runs the model's shapes at 108-112 GFLOP/s
on one thread; oneDNN's ``mkldnn._linear_pointwise`` runs them at 235-246 GFLOP/s
(``python -m bench.engine.matmul_libraries``). Whether oneDNN works in a dtype on this CPU is
probed in ``engine.model.cpu_features`` (bfloat16 needs AVX512-BW/VL/DQ or AVX-NE-CONVERT).
"""

import torch


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def matmul_nt(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` on oneDNN, for a contiguous ``weight`` ``[out, in]`` or one packed by
    ``mkldnn._reorder_linear_weight`` (a strided ``weight`` makes oneDNN take a path 1,000x slower)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` reordered once into oneDNN's blocked layout, for ``matmul_nt``.

    Raises RuntimeError where oneDNN cannot compute in the weight's dtype on this CPU.
    """
    return torch.ops.mkldnn._reorder_linear_weight(weight)
