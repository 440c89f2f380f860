"""Config of several gateways: precise mode is required with shared state; engines wire their sockets."""

import pytest

from gateway.config import ConfigError, parse_config
from gateway.process.supervisor import engine_command

SHARED = {"redis_url": "redis://127.0.0.1:6379/0"}


def test_shared_state_refuses_a_backend_without_kv_events() -> None:
    backends = [
        {"name": "precise", "url": "http://a:8100", "kv_events": "tcp://a:5557"},
        {"name": "guessed", "url": "http://b:8100"},
    ]
    with pytest.raises(ConfigError, match="precise mode.*guessed"):
        parse_config({"backends": backends, "shared_state": SHARED}, "fleet")
    assert parse_config({"backends": backends}, "one gateway").shared_state is None


def test_shared_state_with_every_backend_precise_is_accepted() -> None:
    backends = [{"name": "a", "url": "http://a:8100", "kv_events": "tcp://a:5557"}]
    assert parse_config({"backends": backends, "shared_state": SHARED}, "fleet").shared_state is not None


def test_a_replay_endpoint_needs_kv_events() -> None:
    with pytest.raises(ConfigError, match="kv_events_replay needs kv_events"):
        parse_config({"backends": [{"name": "a", "url": "http://a", "kv_events_replay": "tcp://a:1"}]}, "bad")


def test_kvgate_up_wires_replay_and_load_sockets() -> None:
    engine = {"port": 8101, "kv_events_port": 5557, "kv_events_replay_port": 5567, "load_events_port": 5577}
    config = parse_config({"engines": [engine]}, "up")
    (backend,) = config.backends
    assert (backend.kv_events, backend.kv_events_replay, backend.load_events) == (
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5567",
        "tcp://127.0.0.1:5577",
    )
    command = engine_command(config, config.engines[0])
    for flag, endpoint in [
        ("--kv-events", "tcp://127.0.0.1:5557"),
        ("--kv-events-replay", "tcp://127.0.0.1:5567"),
        ("--load-events", "tcp://127.0.0.1:5577"),
    ]:
        assert command[command.index(flag) + 1] == endpoint


def test_engines_with_pd_roles_are_backends_of_those_roles_and_all_get_the_kv_connector() -> None:
    engines = [{"port": 8101, "role": "prefill"}, {"port": 8102, "role": "decode"}, {"port": 8103}]
    config = parse_config({"engines": engines}, "up")
    assert [backend.role for backend in config.backends] == ["prefill", "decode", "both"]
    for engine in config.engines:
        command = engine_command(config, engine)
        assert command[command.index("--kv-transfer-config") + 1] == '{"kv_role": "kv_both"}', engine
    given = {"port": 8104, "role": "decode", "args": ["--kv-transfer-config", '{"kv_role": "kv_consumer"}']}
    config = parse_config({"engines": [{"port": 8101, "role": "prefill"}, given]}, "up")
    assert engine_command(config, config.engines[1]).count("--kv-transfer-config") == 1, "the engine's own wins"
    aggregated = parse_config({"engines": [{"port": 8101}, {"port": 8102}]}, "up")
    assert all("--kv-transfer-config" not in engine_command(aggregated, e) for e in aggregated.engines)
    among_both = {"engines": [{"port": 8101}, {"port": 8102}], "routing": {"disaggregation": {"among_both": True}}}
    split_anywhere = parse_config(among_both, "up")
    assert all("--kv-transfer-config" in engine_command(split_anywhere, e) for e in split_anywhere.engines)
    with pytest.raises(ConfigError, match="role"):
        parse_config({"engines": [{"port": 8101, "role": "prefil"}]}, "typo")
