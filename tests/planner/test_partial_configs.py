"""Configs without the fields the weights estimate needs, and mixture-of-experts configs."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from planner.arch import ModelArch
from planner.cli import main
from planner.load import load_arch
from tests.procs import REPO

GIB = 1024**3


def preset_config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = orjson.loads((REPO / "planner" / "presets" / f"{name}.json").read_bytes())["config"]
    return config


def write_config(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "config.json"
    path.write_bytes(orjson.dumps(config))
    return str(path)


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    report: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return report


def test_trimmed_config_plans_kv_and_says_why_there_is_no_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trimmed = {key: value for key, value in preset_config("llama-3-8b").items() if key != "intermediate_size"}
    report = plan_json(capsys, "--model", write_config(tmp_path, trimmed), "--gpu-memory", "24GiB")
    assert report["bytes_per_token"]["bf16/fp16"] == 2 * 32 * 8 * 128 * 2
    assert report["architecture"]["parameters"] is None
    assert "'intermediate_size'" in report["architecture"]["parameters_missing"]
    assert report["capacity"] is None
    assert "'intermediate_size'" in report["capacity_unavailable"]
    assert "--weights-gib" in report["capacity_unavailable"]


def test_attention_fields_alone_are_enough_for_the_kv_tables(tmp_path: Path) -> None:
    attention_only = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                      "head_dim": 128, "max_position_embeddings": 8192}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "gateway.process.cli", "plan", "--model", write_config(tmp_path, attention_only),
         "--gpu-memory", "24GiB", "--tensor-parallel", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "bf16/fp16      128 KiB" in result.stdout
    assert "per GPU (TP 2 x PP 1): 32 layers x 4 KV heads (8 / 2) = 64 KiB/token (bf16)" in result.stdout
    assert "capacity: not computed: config is missing 'hidden_size' (needed for the weights estimate)" in result.stdout


def test_weights_gib_stands_in_for_the_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trimmed = {key: value for key, value in preset_config("llama-3-8b").items() if key != "vocab_size"}
    args = ("--model", write_config(tmp_path, trimmed), "--gpu-memory", "24GiB", "--context", "4096")
    capacity = plan_json(capsys, *args, "--weights-gib", "15", "--tensor-parallel", "2")["capacity"]
    assert capacity["weights_source"] == "--weights-gib"
    # 15 GiB over 2 GPUs; 24 GiB x 0.9 - 7.5 - 2 = 12.1 GiB for KV per GPU; 4,096 x 64 KiB = 256 MiB a sequence
    assert capacity["per_gpu"]["weights_bytes"] == 7.5 * GIB
    assert capacity["per_gpu"]["kv_budget_bytes"] == int(24 * GIB * 0.9) - int(7.5 * GIB) - 2 * GIB
    assert capacity["per_gpu"]["max_sequences"] == capacity["per_replica"]["max_sequences"] == 48
    assert capacity["per_replica"]["weights_bytes"] == 15 * GIB


def test_deepseek_v3_shape_without_intermediate_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {key: value for key, value in preset_config("deepseek-v3").items() if key != "intermediate_size"}
    arch = ModelArch.from_hf_config(config)
    # the KV arithmetic is MLA's: 61 layers x (512 + 64) x 2 B
    assert arch.attention_kind == "MLA"
    assert arch.kv_elements_per_token_per_layer * arch.num_layers * 2 == 70_272
    # its first 3 layers (first_k_dense_replace) have a dense MLP whose size only intermediate_size gives
    assert arch.params is None
    assert arch.params_missing is not None and "'intermediate_size'" in arch.params_missing
    assert "dense MLP of layer 0" in arch.params_missing
    report = plan_json(capsys, "--model", write_config(tmp_path, config), "--gpu-memory", "141GB",
                       "--tensor-parallel", "8", "--context", "8192")  # fmt: skip
    assert report["bytes_per_token"]["bf16/fp16"] == 70_272
    assert report["capacity"] is None and "'intermediate_size'" in report["capacity_unavailable"]
    assert report["per_gpu_kv"]["mla_latent_replicated"] is True


def test_deepseek_v3_shape_with_every_layer_moe_counts_from_moe_fields() -> None:
    config = preset_config("deepseek-v3")
    all_moe = {key: value for key, value in config.items() if key != "intermediate_size"} | {"first_k_dense_replace": 0}
    full, moe = load_arch("deepseek-v3").param_count, ModelArch.from_hf_config(all_moe).param_count
    assert full is not None and moe is not None
    hidden = 7168
    dense_mlp = 3 * hidden * 18432
    # 256 routed + 1 shared expert of 2,048, and a router of 256 x hidden
    moe_mlp = 3 * hidden * (256 * 2048 + 1 * 2048) + 256 * hidden
    assert moe - full == 3 * (moe_mlp - dense_mlp)


def test_published_deepseek_v3_and_mixtral_parameter_counts() -> None:
    # DeepSeek-V3: 671 B total without the MTP module (its paper; the checkpoint's 685 B adds it)
    assert load_arch("deepseek-v3").param_count == pytest.approx(671e9, rel=0.001)
    mixtral = {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "vocab_size": 32000,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
    }  # fmt: skip
    # Mixtral 8x7B: 46.7 B parameters (Mistral AI's announcement); experts sized by intermediate_size
    assert ModelArch.from_hf_config(mixtral).param_count == pytest.approx(46.7e9, rel=0.001)


def test_qwen_moe_shared_expert_intermediate_size() -> None:
    qwen_moe = {
        "model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 16, "num_experts": 60, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "vocab_size": 151936, "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    }  # fmt: skip
    # Qwen1.5-MoE-A2.7B: 14.3 B parameters (Qwen's model card)
    assert ModelArch.from_hf_config(qwen_moe).param_count == pytest.approx(14.3e9, rel=0.005)
