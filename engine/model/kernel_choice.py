"""Which kernels the model runs on, per dtype and per op, from what the CPU can do.

On CPU, where oneDNN works in the compute dtype (``engine.model.cpu_features``), weights are packed
into oneDNN's blocked layout (``engine.model.llama.Linear``) and prefill attention is built from oneDNN
matmuls (``engine.model.matmul_attention``); otherwise the portable path runs: ``F.linear`` and
PyTorch's SDPA, which work on every CPU PyTorch runs on. Decode attention is SDPA either way.
Other devices take ``F.linear``; their attention backend is chosen in ``engine.model.flashinfer_attention``.
"""

from dataclasses import dataclass

import torch

from engine.model.cpu_features import DISABLE_ONEDNN_BF16_ENV, DISABLE_ONEDNN_ENV, ONEDNN_BF16_NEEDS, CpuFeatures


@dataclass(frozen=True)
class KernelChoice:
    packed_linear: bool
    """Weights packed for oneDNN (``mkldnn._linear_pointwise``); False: ``F.linear``."""
    matmul_prefill: bool
    """Prefill attention by oneDNN matmuls, tile by tile; False: SDPA."""
    summary: str
    """One line for the start-up log: the choice and, on the portable path, the missing feature."""


def choose_kernels(device: torch.device, dtype: torch.dtype, features: CpuFeatures | None) -> KernelChoice:
    """The kernels for ``dtype`` on ``device``; ``features`` is the CPU's (None off CPU)."""
    name = str(dtype).removeprefix("torch.")
    if device.type != "cpu" or features is None:
        return KernelChoice(False, False, f"kernels: {device.type} {name}: F.linear")
    if features.onednn_for(dtype):
        summary = f"kernels: cpu {name}: oneDNN-packed weights, oneDNN prefill attention, SDPA decode"
        return KernelChoice(True, True, f"{summary} ({features.describe()})")
    summary = f"kernels: cpu {name}: portable F.linear and SDPA attention, missing {_missing(dtype, name, features)}"
    return KernelChoice(False, False, f"{summary} ({features.describe()})")


def _missing(dtype: torch.dtype, name: str, features: CpuFeatures) -> str:
    """What keeps ``dtype`` (called ``name``) off oneDNN, in words."""
    if dtype not in (torch.float32, torch.bfloat16):
        return f"a oneDNN path for {name} (the engine has one for float32 and bfloat16)"
    if DISABLE_ONEDNN_ENV in features.disabled:
        return f"oneDNN (switched off by {DISABLE_ONEDNN_ENV}=1)"
    if dtype == torch.bfloat16 and DISABLE_ONEDNN_BF16_ENV in features.disabled:
        return f"oneDNN bfloat16 (switched off by {DISABLE_ONEDNN_BF16_ENV}=1)"
    if dtype == torch.bfloat16:
        return f"oneDNN bfloat16 (needs {ONEDNN_BF16_NEEDS}); --dtype auto keeps greedy equality with transformers"
    return "oneDNN float32 (this PyTorch build has no working oneDNN)"
