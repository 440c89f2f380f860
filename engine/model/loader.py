"""Find a model's config and float weights: bundled SmolLM2, a GGUF file, or an HF folder.

A GGUF model is dequantized by transformers once (seconds) and saved as safetensors plus
``config.json`` in ``ModelSource.cache_dir / "hf"``; every later load reads that folder. The folder
appears by an atomic rename, so a crashed conversion never leaves half a cache, and a lock file
beside it makes processes that load the model at once (engines starting on one host) wait for
one conversion instead of each converting: on two cores, two conversions at once took ~35-40 s
each against 18 s for one.
"""

import functools
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gguf
import torch
from filelock import FileLock
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from normalize.model_files import ModelSource, resolve_model


@dataclass
class LoadedModel:
    config: PretrainedConfig
    weights: dict[str, torch.Tensor]
    """HF parameter names (``model.layers.0.self_attn.q_proj.weight`` ...) to tensors."""


def load_hf_config(model: str) -> dict:
    """The model's HF config as a dict, without loading or converting weights."""
    source = resolve_model(model)
    folder = _float_weights_dir(source)
    if (folder / "config.json").is_file():
        return AutoConfig.from_pretrained(folder).to_dict()
    return _gguf_config(source).to_dict()


def load_model(model: str, device: str = "cpu") -> LoadedModel:
    """Config and weights (as stored: float32 for a converted GGUF) on ``device``."""
    source = resolve_model(model)
    folder = _float_weights_dir(source)
    if source.gguf_file is not None and not (folder / "config.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(folder.with_name(f"{folder.name}.lock")):
            if not (folder / "config.json").is_file():
                _convert_gguf(source, folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file, device=device))
    return LoadedModel(AutoConfig.from_pretrained(folder), weights)


def _float_weights_dir(source: ModelSource) -> Path:
    return source.hf_dir if source.hf_dir is not None else source.cache_dir / "hf"


def _gguf_config(source: ModelSource) -> PretrainedConfig:
    """The GGUF's config as transformers reads it, completed as the converted folder stores it."""
    assert source.gguf_file is not None
    config = AutoConfig.from_pretrained(source.gguf_file.parent, gguf_file=source.gguf_file.name)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.dtype = torch.float32
    return config


def _convert_gguf(source: ModelSource, target: Path) -> None:
    """Dequantize the GGUF with transformers and save it as an HF folder at ``target``.

    transformers' own GGUF reader dequantizes the tensors and names them after a skeleton of the model
    on the meta device (no memory, no initialization). ``from_pretrained(gguf_file=...)`` reads the
    file's metadata once more and initializes a real model first: 30 s instead of 18 s for
    SmolLM2-135M on the 2-core VM. The config and the tensors come from one parse of the file.
    """
    assert source.gguf_file is not None
    with _gguf_parsed_once():
        config = _gguf_config(source)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        state = load_gguf_checkpoint(str(source.gguf_file), return_tensors=True, model_to_load=skeleton)["tensors"]
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    partial.mkdir(parents=True)
    config.save_pretrained(partial)
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, partial / "model.safetensors")
    try:
        partial.replace(target)
    except OSError:
        shutil.rmtree(partial)
        if not (target / "config.json").is_file():
            raise


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within, a GGUF file is parsed once and its tensor name maps are built once.

    transformers parses the file's metadata for the config and again for the tensors (``GGUFReader``
    reads every tokenizer entry one at a time: ~5 s for SmolLM2-135M on the 2-core VM, each time);
    it only reads from a reader, so one per file serves both. Its GGUF reader also asks gguf for the
    tensor name map of the whole model once per module it visits (397 times for SmolLM2-135M, 7 s of
    a 15 s read on the 2-core VM); the map depends only on the architecture and the layer count, and
    the reader only looks names up in it, so one map per pair serves every call."""
    read = gguf.GGUFReader
    readers: dict[tuple[str, str], gguf.GGUFReader] = {}

    def reader(path: os.PathLike[str] | str, mode: Literal["r", "r+", "c"] = "r") -> gguf.GGUFReader:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = read(path, mode)
        return readers[key]

    build = gguf.get_tensor_name_map
    gguf.GGUFReader = reader  # type: ignore[assignment,misc]
    gguf.get_tensor_name_map = functools.cache(build)
    try:
        yield
    finally:
        gguf.GGUFReader = read  # type: ignore[misc]
        gguf.get_tensor_name_map = build
