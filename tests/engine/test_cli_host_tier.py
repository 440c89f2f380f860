"""``kvgate engine`` flags of the host KV tier, retention hints and the simulated copy cost."""

import pytest

from engine.cli import build_parser, build_runner, config_from_args
from engine.core.config import EngineConfig
from engine.core.host_kv_pool import GIB, host_kv_blocks
from engine.core.kv_budget import plan_kv_budget
from engine.sim.sim_runner import DEFAULT_HOST_BANDWIDTH_GBS, SIM_PRESETS, SimRunner
from normalize.chat_tokenizer import ChatTokenizer
from planner.kv_math import kv_bytes_per_token
from planner.load import load_arch


def parse(*flags: str) -> EngineConfig:
    return config_from_args(build_parser().parse_args(list(flags)))


def test_host_tier_is_sized_in_blocks_or_gib_never_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse("--host-kv-blocks", "1000").host_kv_blocks == 1000
    config = parse("--host-kv-gib", "2")
    assert host_kv_blocks(config.host_kv_blocks, config.host_kv_gib, 46_080 * 16) == 2 * GIB // (46_080 * 16)
    assert host_kv_blocks(None, None, 46_080 * 16) == 0, "no host tier unless asked"
    for bad in (["--host-kv-blocks", "8", "--host-kv-gib", "1"], ["--host-kv-blocks", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--session-retain-fraction", "1.5"])
    assert "--host-kv-blocks" in capsys.readouterr().err


def test_session_flags_have_defaults() -> None:
    config = parse("--session-ttl-s", "30", "--session-retain-fraction", "0.25")
    assert (config.session_ttl_s, config.session_retain_fraction) == (30.0, 0.25)
    assert parse().session_ttl_s > 0 and 0 < parse().session_retain_fraction <= 1


def test_sim_copy_cost_is_kv_bytes_over_bandwidth() -> None:
    arch = load_arch("smollm2-135m")
    per_token = kv_bytes_per_token(arch, "float32") / (DEFAULT_HOST_BANDWIDTH_GBS * 1e9)
    assert SIM_PRESETS["smollm2-cpu"].host_copy_per_token_s == pytest.approx(per_token)
    config = parse("--sim", "--sim-host-bandwidth-gbs", "50", "--kv-cache-dtype", "bfloat16", "--num-blocks", "600")
    runner = build_runner(config, plan_kv_budget(config, arch), ChatTokenizer.load("smollm2-135m"), 64)
    assert isinstance(runner, SimRunner)
    assert runner.costs.host_copy_per_token_s == pytest.approx(kv_bytes_per_token(arch, "bfloat16") / 50e9)
