"""Turn the CONFIG argument (preset, config.json, model folder, GGUF, bundled model) into a ModelArch."""

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import gguf
import orjson

from normalize.model_files import ModelNotFoundError, ModelSource, resolve_model
from planner.arch import ModelArch
from planner.config_fields import ConfigFieldError

# GGUF metadata key (after "<architecture>.") -> HF config field.
_GGUF_FIELDS: dict[str, str] = {
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.sliding_window": "sliding_window",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "expert_count": "num_local_experts",
}
_REQUIRED_GGUF_KEYS = (
    "block_count",
    "attention.head_count",
    "context_length",
)
"""Only what the KV arithmetic needs; a file without the others still plans, with no weights estimate."""


class UnreadableModelFileError(ValueError):
    """A model file exists but cannot be parsed (truncated GGUF, invalid JSON)."""


def preset_names() -> list[str]:
    """Names of the bundled presets (file names without ``.json``)."""
    return sorted(entry.name.removesuffix(".json") for entry in _preset_files())


def load_arch(spec: str) -> ModelArch:
    """A preset name or its source model id (any case), a config.json, a model folder, a GGUF
    file, or a bundled model name."""
    preset = _find_preset(spec)
    if preset is not None:
        return preset
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".json":
        return ModelArch.from_hf_config(_read_json(path), name=spec)
    try:
        source = resolve_model(spec)
    except ModelNotFoundError:
        raise ModelNotFoundError(
            f"{spec!r} is not a preset ({', '.join(preset_names())}), a config.json, "
            "a model folder with config.json, a .gguf file, or a bundled model"
        ) from None
    return arch_from_source(source)


def arch_from_source(source: ModelSource) -> ModelArch:
    """The architecture of a resolved model (what the engine holds at start-up)."""
    if source.gguf_file is not None:
        return ModelArch.from_hf_config(gguf_config(source.gguf_file), name=source.name)
    assert source.hf_dir is not None
    config_path = source.hf_dir / "config.json"
    if not config_path.is_file():
        raise ConfigFieldError(f"{source.hf_dir} has no config.json")
    return ModelArch.from_hf_config(_read_json(config_path), name=source.name)


def gguf_config(path: Path) -> dict[str, Any]:
    """HF-style config fields from a GGUF file's metadata (``<arch>.block_count`` and so on)."""
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError) as error:
        reason = f"{type(error).__name__}: {error}"
        raise UnreadableModelFileError(f"{path} is not a readable GGUF file ({reason})") from None
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.")}
    architecture = fields.get("general.architecture")
    if not isinstance(architecture, str):
        raise ConfigFieldError(f"{path}: GGUF metadata has no 'general.architecture'")
    missing = [f"{architecture}.{key}" for key in _REQUIRED_GGUF_KEYS if f"{architecture}.{key}" not in fields]
    if missing:
        raise ConfigFieldError(f"{path}: GGUF metadata is missing {', '.join(missing)}")
    config: dict[str, Any] = {"model_type": architecture}
    for gguf_key, hf_field in _GGUF_FIELDS.items():
        if f"{architecture}.{gguf_key}" in fields:
            config[hf_field] = fields[f"{architecture}.{gguf_key}"]
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in reader.fields:
        config["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    config["tie_word_embeddings"] = all(tensor.name != "output.weight" for tensor in reader.tensors)
    return config


def _find_preset(spec: str) -> ModelArch | None:
    wanted = spec.lower()
    for entry in _preset_files():
        preset = orjson.loads(entry.read_bytes())
        name = entry.name.removesuffix(".json")
        if wanted in (name, preset["source"].lower()):
            return ModelArch.from_hf_config(preset["config"], name=f"{name} ({preset['source']})")
    return None


def _preset_files() -> list[Traversable]:
    return [entry for entry in (resources.files("planner") / "presets").iterdir() if entry.name.endswith(".json")]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        config = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as error:
        raise UnreadableModelFileError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise UnreadableModelFileError(f"{path} does not hold a JSON object")
    return config
