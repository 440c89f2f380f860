"""What this CPU can do for the engine, probed once at load.

oneDNN support per dtype is probed with the op the engine runs (reordering a weight into oneDNN's
blocked layout, then one product with it): on a CPU without AVX512-BW/VL/DQ or AVX-NE-CONVERT
the bfloat16 reorder raises, which is how an AVX2-only CPU is told apart. The ISA flags come from
torch's own queries (``torch.backends.cpu``, ``torch.cpu``). fp8 KV is stored and converted by
PyTorch in software on every CPU; the probe only checks the conversion runs.

Switches turn a fast path off, so a machine that has it still runs and tests the portable one:
``KVGATE_DISABLE_ONEDNN=1`` (no oneDNN-packed weights or oneDNN attention in any dtype) and
``KVGATE_DISABLE_ONEDNN_BF16=1`` (bfloat16 as on a CPU without oneDNN bfloat16).
"""

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from engine.model.onednn import matmul_nt, onednn_available, pack_weight

DISABLE_ONEDNN_ENV = "KVGATE_DISABLE_ONEDNN"
DISABLE_ONEDNN_BF16_ENV = "KVGATE_DISABLE_ONEDNN_BF16"
ONEDNN_BF16_NEEDS = "avx512bw+avx512vl+avx512dq or avx_ne_convert"


@dataclass(frozen=True)
class CpuFeatures:
    capability: str
    """The widest ISA PyTorch's own CPU kernels use here (``AVX512``, ``AVX2``, ``DEFAULT``, ...)."""
    avx512: bool
    avx512_bf16: bool
    amx: bool
    onednn_float32: bool
    """oneDNN-packed float32 weights work (probed by a trial reorder and product)."""
    onednn_bfloat16: bool
    fp8_conversion: bool
    disabled: tuple[str, ...] = ()
    """Environment switches that turned fast paths off."""

    def onednn_for(self, dtype: torch.dtype) -> bool:
        """Whether the engine may use oneDNN (packed weights, matmul attention) in ``dtype``."""
        return (dtype == torch.float32 and self.onednn_float32) or (dtype == torch.bfloat16 and self.onednn_bfloat16)

    def describe(self) -> str:
        flags = [
            f"isa {self.capability}",
            f"avx512 {_yes(self.avx512)}",
            f"avx512_bf16 {_yes(self.avx512_bf16)}",
            f"amx {_yes(self.amx)}",
            f"fp8 conversion {_yes(self.fp8_conversion)}",
        ]
        if self.disabled:
            flags.append(f"disabled by {', '.join(self.disabled)}")
        return ", ".join(flags)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _onednn_works(dtype: torch.dtype) -> bool:
    """The engine's own oneDNN use, tried once: reorder a weight, multiply by it."""
    if not onednn_available():
        return False
    try:
        weight = pack_weight(torch.ones(32, 32, dtype=dtype))
        product = matmul_nt(torch.ones(2, 32, dtype=dtype), weight)
    except (RuntimeError, NotImplementedError):
        return False
    return bool((product == 32).all())


def _fp8_converts() -> bool:
    try:
        values = torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn).float()
    except (RuntimeError, TypeError):
        return False
    return values.tolist() == [0.5, -2.0]


@functools.cache
def _hardware() -> CpuFeatures:
    return CpuFeatures(
        capability=torch.backends.cpu.get_cpu_capability(),
        avx512=torch.cpu._is_avx512_supported(),
        avx512_bf16=torch.cpu._is_avx512_bf16_supported(),
        amx=torch.cpu._is_amx_tile_supported(),
        onednn_float32=_onednn_works(torch.float32),
        onednn_bfloat16=_onednn_works(torch.bfloat16),
        fp8_conversion=_fp8_converts(),
    )


def probe_cpu(environ: Mapping[str, str] = os.environ) -> CpuFeatures:
    """This CPU's features (probed once per process), less the fast paths ``environ`` switches off."""
    features = _hardware()
    if environ.get(DISABLE_ONEDNN_ENV) == "1":
        features = replace(features, onednn_float32=False, onednn_bfloat16=False)
        features = replace(features, disabled=(*features.disabled, DISABLE_ONEDNN_ENV))
    if environ.get(DISABLE_ONEDNN_BF16_ENV) == "1":
        features = replace(features, onednn_bfloat16=False, disabled=(*features.disabled, DISABLE_ONEDNN_BF16_ENV))
    return features
