"""``kvgate plan`` end to end: text tables, --json, every kind of CONFIG, and bad input."""

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from normalize.model_files import resolve_model
from planner.cli import main
from tests.procs import REPO


def run_kvgate_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.process.cli", "plan", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return orjson.loads(capsys.readouterr().out)


def test_text_output_shows_formula_dtypes_lengths_and_capacity() -> None:
    result = run_kvgate_plan(
        "--model", "Qwen2-7B", "--gpu-memory", "24GiB", "--context", "3584", "--output-tokens", "512"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "bytes/token = 2 (K and V) x 28 layers x 4 kv_heads x 128 head_dim x bytes/element" in out
    assert "bf16/fp16       56 KiB" in out
    assert "131,072" in out and "7 GiB" in out
    assert "max concurrent sequences                       24" in out


def test_tensor_parallel_table_and_smallest_tp_line() -> None:
    result = run_kvgate_plan(
        "--model", "llama-3-70b", "--gpu-memory", "80GB", "--context", "4096", "--tensor-parallel", "4",
        "--concurrency", "32",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "per GPU (TP 4 x PP 1): 80 layers x 2 KV heads (8 / 4) = 80 KiB/token (bf16)" in out
    assert "capacity (TP 4 x PP 1 = 4 GPUs)         per GPU  per replica" in out
    assert "- weights (bf16)                      32.86 GiB    131.4 GiB" in out
    assert "max concurrent sequences                    103          103" in out
    assert "for 32 concurrent sequences of 4,096 tokens: 4 (sequences TP 1: 0, TP 2: 0, TP 4: 103)" in out


def test_json_carries_the_same_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan_json(capsys, "--model", "llama-2-7b", "--gpu-memory", "80GB", "--output-tokens", "96")
    assert report["architecture"]["attention"] == "MHA"
    assert report["bytes_per_token"]["bf16/fp16"] == 512 * 1024
    assert [row["tokens"] for row in report["per_sequence"]] == [1024, 4096]
    assert report["capacity"]["prompt_tokens"] == 4000
    assert report["capacity"]["per_gpu"]["sequence_bytes"] == 4096 * 512 * 1024


def test_lengths_stop_at_the_context_and_windows_cap_them(capsys: pytest.CaptureFixture[str]) -> None:
    rows = plan_json(capsys, "--model", "mistral-7b-v0.1")["per_sequence"]
    assert [row["tokens"] for row in rows] == [1024, 4096, 8192, 32768]
    assert [row["window_capped"] for row in rows] == [False, False, True, True]
    assert rows[-1]["bytes"] == rows[1]["bytes"]


def test_bundled_gguf(capsys: pytest.CaptureFixture[str]) -> None:
    gguf_file = resolve_model("smollm2-135m").gguf_file
    assert gguf_file is not None
    report = plan_json(capsys, "--model", str(gguf_file))
    assert report["architecture"] | {"parameters": None} == {
        "attention": "GQA", "layers": 30, "attention_heads": 9, "kv_heads": 3, "head_dim": 64,
        "kv_lora_rank": None, "qk_rope_head_dim": None, "sliding_window_layers": 0, "sliding_window": None,
        "max_context": 8192, "parameters": None, "parameters_missing": None,
    }  # fmt: skip
    assert report["bytes_per_token"]["bf16/fp16"] == 22.5 * 1024


def test_config_json_and_model_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preset = orjson.loads((REPO / "planner" / "presets" / "llama-3-8b.json").read_bytes())
    (tmp_path / "config.json").write_bytes(orjson.dumps(preset["config"]))
    from_file = plan_json(capsys, "--model", str(tmp_path / "config.json"))
    from_folder = plan_json(capsys, "--model", str(tmp_path))
    assert from_file["bytes_per_token"] == from_folder["bytes_per_token"]
    assert from_file["bytes_per_token"]["bf16/fp16"] == 128 * 1024


def test_config_missing_a_field_names_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(orjson.dumps({"hidden_size": 4096, "num_attention_heads": 32}))
    result = run_kvgate_plan("--model", str(tmp_path / "config.json"))
    assert result.returncode == 2
    assert "num_hidden_layers" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model"], "not a preset"),
        (["--model", "llama-2-7b", "--gpu-memory", "lots"], "not a memory size"),
        (["--model", "llama-2-7b", "--gpu-memory", "24", "--context", "4090", "--output-tokens", "9"], "max"),
        (["--model", "llama-2-7b", "--context", "100"], "give --gpu-memory"),
        (["--model", "llama-2-7b", "--gpu-memory", "24", "--utilization", "1.5"], "utilization"),
        (["--model", "llama-2-7b", "--kv-dtype", "auto"], "invalid choice"),
        (["--model", "llama-3-70b", "--tensor-parallel", "3"], "does not divide the 64 attention heads"),
        (["--model", "llama-3-70b", "--pipeline-parallel", "0"], "must be >= 1"),
        (["--model", "llama-3-70b", "--weights-gib", "100"], "give --gpu-memory"),
        (["--model", "llama-3-70b", "--concurrency", "8"], "give --gpu-memory"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    result = run_kvgate_plan(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("file_name", "content", "message"),
    [("model.gguf", b"GGUF\x03\x00\x00\x00", "not a readable GGUF file"), ("config.json", b"{oops", "not valid JSON")],
)
def test_unreadable_model_file_exits_2(tmp_path: Path, file_name: str, content: bytes, message: str) -> None:
    (tmp_path / file_name).write_bytes(content)
    result = run_kvgate_plan("--model", str(tmp_path / file_name))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_help_describes_every_flag() -> None:
    result = run_kvgate_plan("--help")
    assert result.returncode == 0
    for flag in ("--model", "--kv-dtype", "--gpu-memory", "--weights-dtype", "--utilization", "--overhead-gib",
                 "--context", "--output-tokens", "--tensor-parallel", "--pipeline-parallel", "--weights-gib",
                 "--concurrency", "--json"):  # fmt: skip
        assert flag in result.stdout
