"""A PEFT LoRA adapter's weights, checked against the model and laid out for its fused projections.

The model fuses q/k/v into one projection and gate/up into another (``engine/model/llama.py``). An
adapter's ``lora_A`` matrices of one fused projection are stacked into one ``A`` (one matmul
over the input), and its ``lora_B`` matrices into one block-diagonal ``B`` whose rows cover only
the span of the fused output the adapter touches: each module's delta lands on its own slice.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import PretrainedConfig

from engine.model.lora_modules import WEIGHTS_FILE, AdapterConfig, LoRAError

FUSED_PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
"""Each fused projection of a decoder layer and the HF modules it stacks, in output order."""
_PARENT = {module: "self_attn" for module in ("q_proj", "k_proj", "v_proj", "o_proj")} | {
    module: "mlp" for module in ("gate_proj", "up_proj", "down_proj")
}
"""The HF submodule (``model.layers.N.<parent>``) that holds each adaptable projection."""
_KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


@dataclass(frozen=True)
class ProjectionShape:
    in_features: int
    out_features: dict[str, int]
    """Output size of each stacked module, in output order."""


def projection_shapes(config: PretrainedConfig, head_dim: int) -> dict[str, ProjectionShape]:
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    return {
        "qkv": ProjectionShape(hidden, {"q_proj": q_size, "k_proj": kv_size, "v_proj": kv_size}),
        "o": ProjectionShape(q_size, {"o_proj": hidden}),
        "gate_up": ProjectionShape(hidden, {"gate_proj": inter, "up_proj": inter}),
        "down": ProjectionShape(inter, {"down_proj": hidden}),
    }


@dataclass(frozen=True)
class FusedLoRA:
    """One adapter on one fused projection: ``out[:, start:end] += (x @ a.T @ b.T) * scale``."""

    a: torch.Tensor
    """``[modules x rank, in_features]``."""
    b: torch.Tensor
    """``[end - start, modules x rank]``, block-diagonal."""
    start: int
    end: int
    scale: float

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.a), self.b) * self.scale


@dataclass(frozen=True)
class AdapterWeights:
    config: AdapterConfig
    layers: list[dict[str, FusedLoRA]]
    """Per decoder layer, the fused projections the adapter changes."""


def load_adapter(
    config: AdapterConfig,
    shapes: dict[str, ProjectionShape],
    num_layers: int,
    dtype: torch.dtype,
    device: torch.device,
) -> AdapterWeights:
    """Read and check the adapter's weights; raises ``LoRAError`` on any module or shape it cannot serve."""
    where = f"LoRA adapter {config.module.name!r} ({config.module.path})"
    pairs = _read_pairs(config.module.path, num_layers, where)
    layers: list[dict[str, FusedLoRA]] = [{} for _ in range(num_layers)]
    for (layer, module), (a, b) in pairs.items():
        projection = next(name for name, modules in FUSED_PROJECTIONS.items() if module in modules)
        shape = shapes[projection]
        expected_a, expected_b = (config.rank, shape.in_features), (shape.out_features[module], config.rank)
        if tuple(a.shape) != expected_a or tuple(b.shape) != expected_b:
            raise LoRAError(
                f"{where}: layer {layer} {module} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}; "
                f"the model needs {expected_a} and {expected_b} (rank {config.rank}): shape mismatch"
            )
    for layer in range(num_layers):
        for projection, shape in shapes.items():
            present = {
                module: pairs[(layer, module)] for module in FUSED_PROJECTIONS[projection] if (layer, module) in pairs
            }
            if present:
                layers[layer][projection] = _fuse(present, shape, config, dtype, device)
    return AdapterWeights(config, layers)


def _read_pairs(folder: Path, num_layers: int, where: str) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise LoRAError(f"{where}: no {WEIGHTS_FILE}")
    halves: dict[tuple[int, str, str], torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as weights:
        for key in weights.keys():  # noqa: SIM118 (safe_open is not a mapping)
            match = _KEY.fullmatch(key)
            if match is None:
                raise LoRAError(f"{where}: weight {key!r} is not a LoRA weight of a supported module")
            layer, parent, module, half = int(match[1]), match[2], match[3], match[4]
            if _PARENT.get(module) != parent:
                raise LoRAError(f"{where}: unknown target module {parent}.{module} in {key!r}")
            if layer >= num_layers:
                raise LoRAError(f"{where}: {key!r} is for layer {layer}; the model has {num_layers}")
            halves[(layer, module, half)] = weights.get_tensor(key)
    pairs = {}
    for layer, module, half in halves:
        other = (layer, module, "B" if half == "A" else "A")
        if other not in halves:
            raise LoRAError(f"{where}: layer {layer} {module} has lora_{half} but no lora_{other[2]}")
        pairs[(layer, module)] = (halves[(layer, module, "A")], halves[(layer, module, "B")])
    if not pairs:
        raise LoRAError(f"{where}: {WEIGHTS_FILE} holds no LoRA weights")
    return pairs


def _fuse(
    present: dict[str, tuple[torch.Tensor, torch.Tensor]],
    shape: ProjectionShape,
    config: AdapterConfig,
    dtype: torch.dtype,
    device: torch.device,
) -> FusedLoRA:
    offsets, offset = {}, 0
    for module, size in shape.out_features.items():
        offsets[module] = offset
        offset += size
    modules = list(present)
    start = offsets[modules[0]]
    end = offsets[modules[-1]] + shape.out_features[modules[-1]]
    rank = config.rank
    b = torch.zeros(end - start, rank * len(modules), dtype=torch.float32)
    for column, module in enumerate(modules):
        row = offsets[module] - start
        b[row : row + shape.out_features[module], column * rank : (column + 1) * rank] = present[module][1]
    a = torch.cat([present[module][0] for module in modules])
    return FusedLoRA(
        a.to(device=device, dtype=dtype).contiguous(), b.to(device=device, dtype=dtype), start, end, config.scale
    )
