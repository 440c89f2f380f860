"""Which contenders a run compares, and the config kvgate gets in front of the replicas."""

import pytest

from bench.cli import sim_cost_args
from bench.harness.contenders import Contender, FleetSpec, Replica, contenders_for, kvgate_config, sglang_install_hint
from engine.sim.sim_runner import SIM_PRESETS
from gateway.config import parse_config


def test_all_policies_plus_direct_and_peers() -> None:
    names = [contender.name for contender in contenders_for(["all"], peers=True)]
    assert names[0] == "kvgate cache_aware"
    assert {"kvgate round_robin", "kvgate session", "direct round_robin"} <= set(names)
    assert names[-2:] == ["sglang-router cache_aware", "sglang-router round_robin"]
    assert not any(name.startswith("sglang") for name in (c.name for c in contenders_for(["all"], peers=False)))


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown policies"):
        contenders_for(["fastest"], peers=False)


def test_kvgate_config_is_valid_and_follows_kv_events() -> None:
    replicas = [Replica("http://127.0.0.1:9001", "tcp://127.0.0.1:5001"), Replica("http://127.0.0.1:9002")]
    contender = Contender("kvgate", "cache_aware", routing={"min_match_tokens": 32})
    config = parse_config(kvgate_config(contender, FleetSpec(replicas=2, num_blocks=100), replicas, 8000), "bench")
    assert [backend.kv_events for backend in config.backends] == ["tcp://127.0.0.1:5001", None]
    assert all(backend.kv_capacity_blocks == 100 for backend in config.backends)
    assert config.routing.policy == "cache_aware" and config.routing.min_match_tokens == 32


def test_sim_costs_keep_the_preset_shape() -> None:
    preset = SIM_PRESETS["smollm2-cpu"]
    flags = dict(flag.removeprefix("--").split("=") for flag in sim_cost_args(preset.prefill_per_token_s / 10))
    assert float(flags["sim-prefill-per-token-s"]) == pytest.approx(preset.prefill_per_token_s / 10)
    assert float(flags["sim-decode-base-s"]) == pytest.approx(preset.decode_base_s / 10)


def test_missing_peer_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_PEERS_DIR", "/nonexistent/peers")
    assert "pip install sglang-router" in sglang_install_hint()
    assert "/nonexistent/peers/sgl" in sglang_install_hint()
