"""LoRA adapters named on the command line (``--lora-modules``) and their PEFT configs, without torch.

An adapter is a PEFT folder: ``adapter_config.json`` and ``adapter_model.safetensors``. This
module parses the flag (vLLM's shapes: ``NAME=PATH`` or a JSON object with ``name`` and ``path``)
and checks each config against what the engine can serve: plain LoRA (no DoRA, no bias, no
per-module ranks, no extra saved modules) on the attention and MLP projections, rank at most
``--max-lora-rank``. The simulated engine stops here; the real one also loads and checks the
weights (``engine/model/lora_weights.py``).
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
DEFAULT_MAX_LORA_RANK = 16
"""vLLM's default ``--max-lora-rank``."""


class LoRAError(ValueError):
    """An adapter the engine cannot serve; the engine refuses to start with it."""


@dataclass(frozen=True)
class LoRAModule:
    """One ``--lora-modules`` entry."""

    name: str
    path: Path


@dataclass(frozen=True)
class LoRARef:
    """The adapter a request runs under: its name (hashed into its blocks) and its vLLM-style int id."""

    name: str
    lora_id: int
    """1 for the first ``--lora-modules`` entry, 2 for the next ... (0 is the base model)."""


@dataclass(frozen=True)
class AdapterConfig:
    """The parts of a PEFT LoRA config the engine uses."""

    module: LoRAModule
    rank: int
    scale: float
    """``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora``."""
    target_modules: tuple[str, ...] | None
    """Projection names the config lists; None when it gives a regex (the weights decide)."""


def parse_lora_module(text: str) -> LoRAModule:
    """``NAME=PATH`` or ``{"name": ..., "path": ...}`` (vLLM's two forms)."""
    if text.lstrip().startswith("{"):
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise LoRAError(f"--lora-modules {text!r} is not valid JSON: {exc}") from None
        name, path = (data.get("name"), data.get("path")) if isinstance(data, dict) else (None, None)
        if not isinstance(name, str) or not isinstance(path, str):
            raise LoRAError(f'--lora-modules {text!r}: the JSON form needs string "name" and "path"')
    else:
        name, sep, path = text.partition("=")
        if not sep:
            raise LoRAError(f"--lora-modules {text!r} is not NAME=PATH")
    if not name or not path:
        raise LoRAError(f"--lora-modules {text!r}: name and path must not be empty")
    return LoRAModule(name, Path(path))


def lora_refs(modules: tuple[LoRAModule, ...]) -> dict[str, LoRARef]:
    """Each adapter's name and id, ids counted from 1 in flag order as vLLM numbers them."""
    return {module.name: LoRARef(module.name, index + 1) for index, module in enumerate(modules)}


def check_modules(modules: tuple[LoRAModule, ...], served_model_name: str, max_rank: int) -> list[AdapterConfig]:
    """Every adapter's config, checked; raises ``LoRAError`` naming the adapter and the problem."""
    names = [module.name for module in modules]
    for name in names:
        if names.count(name) > 1:
            raise LoRAError(f"--lora-modules names {name!r} twice")
        if name == served_model_name:
            raise LoRAError(f"--lora-modules {name!r} is the served model's own name")
    return [read_adapter_config(module, max_rank) for module in modules]


def read_adapter_config(module: LoRAModule, max_rank: int) -> AdapterConfig:
    where = f"LoRA adapter {module.name!r} ({module.path})"
    config_path = module.path / CONFIG_FILE
    if not config_path.is_file():
        raise LoRAError(f"{where}: no {CONFIG_FILE}")
    try:
        config = orjson.loads(config_path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise LoRAError(f"{where}: {CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LoRAError(f"{where}: {CONFIG_FILE} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"{where}: peft_type {config['peft_type']!r} is not LORA")
    _refuse_unsupported(config, where)
    rank = config.get("r")
    if not isinstance(rank, int) or rank <= 0:
        raise LoRAError(f"{where}: r must be a positive integer, not {rank!r}")
    if rank > max_rank:
        raise LoRAError(f"{where}: rank {rank} is above --max-lora-rank {max_rank}")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, int | float):
        raise LoRAError(f"{where}: lora_alpha must be a number, not {alpha!r}")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targets = _target_modules(config.get("target_modules"), where)
    return AdapterConfig(module, rank, float(scale), targets)


def _refuse_unsupported(config: dict[str, Any], where: str) -> None:
    checks = {
        "use_dora": "DoRA",
        "fan_in_fan_out": "fan_in_fan_out weights",
        "modules_to_save": "modules_to_save (fully trained extra modules)",
        "rank_pattern": "per-module ranks (rank_pattern)",
        "alpha_pattern": "per-module alphas (alpha_pattern)",
        "lora_bias": "LoRA biases",
        "trainable_token_indices": "trainable token embeddings",
    }
    for key, what in checks.items():
        if config.get(key):
            raise LoRAError(f"{where}: {what} not supported")
    if config.get("bias", "none") != "none":
        raise LoRAError(f"{where}: bias {config['bias']!r} not supported (only 'none')")


def _target_modules(targets: object, where: str) -> tuple[str, ...] | None:
    if isinstance(targets, str):
        return None
    if not isinstance(targets, list) or not all(isinstance(target, str) for target in targets) or not targets:
        raise LoRAError(f"{where}: target_modules must be a non-empty list of names or a regex")
    unknown = sorted(set(targets) - set(SUPPORTED_TARGETS))
    if unknown:
        raise LoRAError(f"{where}: unknown target modules {unknown}; this engine adapts {', '.join(SUPPORTED_TARGETS)}")
    return tuple(targets)
