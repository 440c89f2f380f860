"""oneDNN matrix products on CPU.

PyTorch sends a float32 ``mm``/``bmm``/``F.linear`` (and the CPU flash-attention kernel's inner
products) to MKL, which on the AMD EPYC we measure on runs the model's shapes at 108-112 GFLOP/s
on one thread; oneDNN's ``mkldnn._linear_pointwise`` runs them at 235-246 GFLOP/s
(``python -m bench.engine.matmul_libraries``). bfloat16 products go to oneDNN either way.
"""

import torch

ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def uses_onednn(tensor: torch.Tensor) -> bool:
    """Whether products with ``tensor`` (a weight) can run on oneDNN."""
    return tensor.device.type == "cpu" and tensor.dtype in ONEDNN_DTYPES and onednn_available()


def matmul_nt(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` on oneDNN, for a contiguous ``weight`` ``[out, in]`` or one packed by
    ``mkldnn._reorder_linear_weight`` (a strided ``weight`` makes oneDNN take a path 1,000x slower)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
