"""Config for remote upstreams, aliases and adapters: keys resolved and hidden, names checked."""

import pytest

from gateway.config import ConfigError, parse_config


def test_an_upstream_key_from_the_environment_is_sent_but_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "sk-very-secret")
    config = parse_config(
        {"backends": [{"name": "r", "url": "http://x", "api_key_env": "PROVIDER_KEY", "headers": {"x-org": "o"}}]},
        "test",
    )
    backend = config.backends[0]
    assert backend.upstream_headers() == {"x-org": "o", "Authorization": "Bearer sk-very-secret"}
    assert "sk-very-secret" not in repr(config) and "sk-very-secret" not in config.model_dump_json()
    inline = parse_config({"backends": [{"name": "r", "url": "http://x", "api_key": "env:PROVIDER_KEY"}]}, "test")
    assert inline.backends[0].upstream_api_key() == "sk-very-secret"


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        ({"api_key_env": "NOT_SET_ANYWHERE"}, "NOT_SET_ANYWHERE is not set"),
        ({"api_key_env": "PROVIDER_KEY", "api_key": "inline"}, "not both"),
    ],
)
def test_bad_key_settings_stop_start_up(monkeypatch: pytest.MonkeyPatch, backend: dict, problem: str) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "k")
    with pytest.raises(ConfigError, match=problem):
        parse_config({"backends": [{"name": "r", "url": "http://x", **backend}]}, "test")


def test_an_alias_may_not_shadow_a_model_or_adapter() -> None:
    backends = [{"name": "e", "url": "http://x", "adapters": ["my-lora"]}]
    with pytest.raises(ConfigError, match="already a model or adapter"):
        parse_config({"backends": backends, "model_aliases": {"my-lora": "smollm2-135m"}}, "test")
    config = parse_config({"backends": backends, "model_aliases": {"small": "my-lora"}}, "test")
    assert config.model_aliases == {"small": "my-lora"}
