"""Config loading and reload_guard.py: files that must never apply, and changes that need an explicit allow."""

from pathlib import Path

import pytest
import yaml

from gateway.config import ConfigError, KvgateConfig, load_config, parse_config
from gateway.errors import OpenAIError
from gateway.wiring.reload_guard import UnsafeReload, check_safe, parse_allowance

SECURED = {
    "backends": [{"name": "e0", "url": "http://127.0.0.1:8101"}],
    "tenants": [{"name": "team", "api_keys": ["k"]}],
    "admin": {"api_key": "admin"},
}


@pytest.mark.parametrize(
    "url", ["not a url", "127.0.0.1:8101", "ftp://host:21", "http://", "http://host:99999", "http://host:0"]
)
def test_a_backend_url_that_is_not_http_is_refused_at_load(url: str) -> None:
    with pytest.raises(ConfigError, match="backends.0.url"):
        parse_config({"backends": [{"name": "e0", "url": url}]}, "test.yaml")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8101", "https://api.example.com/v1", "http://[::1]:80"])
def test_http_urls_load(url: str) -> None:
    assert parse_config({"backends": [{"name": "e0", "url": url}]}, "test.yaml").backends[0].url == url


@pytest.mark.parametrize("text", ["", "   \n", "# nothing here\n# backends: []\n"])
def test_an_empty_or_comment_only_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="empty"):
        load_config(path)


def test_a_reload_refuses_a_file_without_its_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(SECURED).rstrip("\n"))
    assert load_config(path).tenants, "start-up reads it"
    with pytest.raises(ConfigError, match="cut off"):
        load_config(path, whole_file=True)


def config(**changes: object) -> KvgateConfig:
    return parse_config({**SECURED, **changes}, "test.yaml")


@pytest.mark.parametrize(
    ("changes", "needed"),
    [
        ({"backends": []}, "no_backends"),
        ({"tenants": []}, "no_auth"),
        ({"admin": {}}, "no_auth"),
        ({"backends": [], "tenants": []}, "no_auth,no_backends"),
    ],
)
def test_removing_every_backend_or_auth_needs_an_explicit_allow(changes: dict, needed: str) -> None:
    with pytest.raises(UnsafeReload, match=f"allow={needed}$"):
        check_safe(config(), config(**changes), "test.yaml", frozenset())
    check_safe(config(), config(**changes), "test.yaml", parse_allowance([needed]))


def test_an_open_gateway_may_stay_open_and_unknown_allowances_are_400() -> None:
    open_gateway = parse_config({"backends": SECURED["backends"]}, "test.yaml")
    check_safe(open_gateway, open_gateway, "test.yaml", frozenset())
    with pytest.raises(OpenAIError) as error:
        parse_allowance(["no_auth,everything"])
    assert error.value.status == 400 and "everything" in error.value.message
