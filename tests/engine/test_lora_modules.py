"""``--lora-modules`` parsing and the start-up checks of adapters: config, modules, ranks, shapes."""

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig

from engine.model.lora_modules import LoRAError, LoRAModule, check_modules, parse_lora_module
from engine.model.lora_weights import load_adapter, projection_shapes
from tests.lora_adapter import base_model_folder
from tests.procs import REPO, kvgate_cmd

MODEL = "smollm2-135m"
PREFIX = "base_model.model.model.layers"


def write_adapter(folder: Path, weights: dict[str, torch.Tensor], **config: Any) -> Path:
    """A PEFT-shaped adapter folder with the given tensors and config fields over plain LoRA defaults."""
    folder.mkdir(parents=True, exist_ok=True)
    base = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "bias": "none"}
    (folder / "adapter_config.json").write_bytes(orjson.dumps(base | config))
    save_file(weights, folder / "adapter_model.safetensors")
    return folder


def q_proj(layer: int = 0, rank: int = 8, in_features: int = 576, out_features: int = 576) -> dict[str, torch.Tensor]:
    key = f"{PREFIX}.{layer}.self_attn.q_proj"
    return {
        f"{key}.lora_A.weight": torch.zeros(rank, in_features),
        f"{key}.lora_B.weight": torch.zeros(out_features, rank),
    }


def test_lora_modules_flag_takes_vllm_forms() -> None:
    assert parse_lora_module("sql=/adapters/sql") == LoRAModule("sql", Path("/adapters/sql"))
    assert parse_lora_module('{"name": "sql", "path": "/a/sql", "base_model_name": "x"}') == LoRAModule(
        "sql", Path("/a/sql")
    )
    for bad in ("sql", "=/a", "sql=", '{"name": "sql"}', "{not json"):
        with pytest.raises(LoRAError):
            parse_lora_module(bad)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"r": 32}, "rank 32 is above --max-lora-rank 16"),
        ({"target_modules": ["q_proj", "lm_head"]}, "unknown target modules ['lm_head']"),
        ({"use_dora": True}, "DoRA not supported"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
        ({"bias": "all"}, "bias 'all' not supported"),
        ({"peft_type": "IA3"}, "peft_type 'IA3' is not LORA"),
    ],
)
def test_configs_the_engine_cannot_serve_are_refused(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    module = LoRAModule("bad", write_adapter(tmp_path / "bad", q_proj(), **config))
    with pytest.raises(LoRAError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_modules((module,), MODEL, max_rank=16)


def test_names_must_be_unique_and_not_the_base_model(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "a", q_proj())
    with pytest.raises(LoRAError, match="twice"):
        check_modules((LoRAModule("a", folder), LoRAModule("a", folder)), MODEL, max_rank=16)
    with pytest.raises(LoRAError, match="served model's own name"):
        check_modules((LoRAModule(MODEL, folder),), MODEL, max_rank=16)
    with pytest.raises(LoRAError, match="no adapter_config.json"):
        check_modules((LoRAModule("missing", tmp_path / "missing"),), MODEL, max_rank=16)


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path: Path) -> None:
    plain = LoRAModule("plain", write_adapter(tmp_path / "plain", q_proj(rank=4), r=4, lora_alpha=8))
    rs = LoRAModule("rs", write_adapter(tmp_path / "rs", q_proj(rank=4), r=4, lora_alpha=8, use_rslora=True))
    assert [config.scale for config in check_modules((plain, rs), MODEL, max_rank=16)] == [2.0, 4.0]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (q_proj(in_features=100), "shape mismatch"),
        (q_proj(out_features=192), "shape mismatch"),
        (q_proj(layer=99), "is for layer 99; the model has 30"),
        ({f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 576)}, "has lora_A but no lora_B"),
        ({"base_model.model.lm_head.lora_A.weight": torch.zeros(8, 576)}, "not a LoRA weight of a supported module"),
        ({f"{PREFIX}.0.mlp.q_proj.lora_A.weight": torch.zeros(8, 576)}, "unknown target module mlp.q_proj"),
    ],
)
def test_weights_that_do_not_fit_the_model_are_refused(
    tmp_path: Path, weights: dict[str, torch.Tensor], message: str
) -> None:
    config = AutoConfig.from_pretrained(base_model_folder(MODEL))
    (adapter,) = check_modules((LoRAModule("x", write_adapter(tmp_path / "x", weights)),), MODEL, max_rank=16)
    shapes = projection_shapes(config, config.hidden_size // config.num_attention_heads)
    with pytest.raises(LoRAError, match=message):
        load_adapter(adapter, shapes, config.num_hidden_layers, torch.float32, torch.device("cpu"))


def test_engine_refuses_to_start_with_an_adapter_above_the_max_rank(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "big", q_proj(rank=32), r=32)
    command = kvgate_cmd("engine", "--sim", "--lora-modules", f"big={folder}", "--max-lora-rank", "16")
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "LoRA adapter 'big'" in result.stderr and "rank 32 is above --max-lora-rank 16" in result.stderr
