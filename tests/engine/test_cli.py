"""``kvgate engine`` flags, the KV arithmetic at start-up, and a simulated mode free of torch."""

import subprocess
import sys

import pytest

from engine.cli import build_parser, build_server, config_from_args, main
from engine.core.config import AUTO_DTYPE
from engine.core.kv_budget import KVBudgetError, plan_kv_budget
from engine.model.cpu_features import DISABLE_ONEDNN_BF16_ENV
from planner.load import load_arch
from tests.procs import REPO, http, start_engine


def test_every_flag_is_explained() -> None:
    parser = build_parser()
    undocumented = [action.option_strings for action in parser._actions if action.option_strings and not action.help]
    assert undocumented == []
    assert "--kv-cache-gib" in parser.format_help() and "--sim-decode-base-s" in parser.format_help()


def test_sim_flags_override_the_preset() -> None:
    config = config_from_args(
        build_parser().parse_args(["--sim", "--sim-decode-base-s", "0.5", "--served-model-name", "m"])
    )
    assert config.sim and config.sim_costs is not None
    assert config.sim_costs.decode_base_s == 0.5 and config.sim_costs.prefill_per_token_s > 0
    assert config.served_model_name == "m"
    assert not config_from_args(build_parser().parse_args([])).sim


def test_kv_budget_from_gib_states_the_arithmetic() -> None:
    config = config_from_args(build_parser().parse_args(["--kv-cache-gib", "0.5", "--max-model-len", "4096"]))
    budget = plan_kv_budget(config, load_arch("smollm2-135m"))
    assert budget.bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert budget.num_blocks == int(0.5 * 1024**3) // (budget.bytes_per_token * 16)
    assert budget.max_concurrency == pytest.approx(budget.num_blocks / 256)
    line = budget.describe()
    assert "46,080 bytes/token" in line and f"{budget.num_blocks:,} blocks" in line and "4,096" in line


def test_fp8_kv_halves_bfloat16_bytes_per_token() -> None:
    arch = load_arch("smollm2-135m")
    fp8 = plan_kv_budget(config_from_args(build_parser().parse_args(["--kv-cache-dtype", "fp8"])), arch)
    bf16 = plan_kv_budget(config_from_args(build_parser().parse_args(["--dtype", "bfloat16"])), arch)
    assert bf16.bytes_per_token == 2 * fp8.bytes_per_token


def test_a_pool_smaller_than_one_max_length_request_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    config = config_from_args(build_parser().parse_args(["--num-blocks", "10", "--max-model-len", "1024"]))
    with pytest.raises(KVBudgetError):
        plan_kv_budget(config, load_arch("smollm2-135m"))
    assert main(["--sim", "--num-blocks", "10", "--max-model-len", "1024"]) == 2
    assert "needs 64 blocks" in capsys.readouterr().err


def test_max_model_len_beyond_the_model_context_is_refused() -> None:
    assert main(["--sim", "--max-model-len", "100000"]) == 2


def test_simulated_engine_builds_without_torch_or_transformers() -> None:
    code = (
        "import sys\n"
        "from engine.cli import build_parser, build_server, config_from_args\n"
        "build_server(config_from_args(build_parser().parse_args(['--sim', '--num-blocks', '600'])))\n"
        "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_max_loras_is_accepted_and_reaches_the_scheduler() -> None:
    args = build_parser().parse_args(["--sim", "--num-blocks", "600", "--max-loras", "2"])
    assert build_server(config_from_args(args)).engine.scheduler.max_loras == 2
    assert config_from_args(build_parser().parse_args([])).max_loras is None, "default: no limit"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-loras", "0"])


def test_dtype_auto_is_the_default_and_sizes_the_pool_as_float32() -> None:
    auto = config_from_args(build_parser().parse_args([]))
    assert auto.dtype == "auto" and auto.model_dtype == AUTO_DTYPE == "float32"
    float32 = config_from_args(build_parser().parse_args(["--dtype", "float32"]))
    arch = load_arch("smollm2-135m")
    assert plan_kv_budget(auto, arch).bytes_per_token == plan_kv_budget(float32, arch).bytes_per_token


def test_bfloat16_without_fast_bfloat16_serves_on_the_portable_path(tmp_path, monkeypatch) -> None:
    """As on a CPU without oneDNN bfloat16 (AVX2 only): the engine serves, and says why in one log line."""
    monkeypatch.setenv(DISABLE_ONEDNN_BF16_ENV, "1")
    flags = ("--dtype", "bfloat16", "--num-blocks", "256", "--max-model-len", "1024", "--threads", "1")
    engine = start_engine(tmp_path, *flags)
    try:
        body = {"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        reply = http("POST", f"{engine.url}/v1/completions", body)
    finally:
        engine.stop()
    assert reply.status == 200, reply.body
    assert "Paris" in reply.json()["choices"][0]["text"]  # type: ignore[index]
    log = engine.log()
    choice = [line for line in log.splitlines() if "kernels:" in line]
    assert len(choice) == 1 and "bfloat16: portable" in choice[0] and DISABLE_ONEDNN_BF16_ENV in choice[0]
    assert "Traceback" not in log
