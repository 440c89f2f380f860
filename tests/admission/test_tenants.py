"""Tenants: API keys (inline or from the environment), budgets, cache salts, admin access."""

import pytest
from aiohttp.test_utils import make_mocked_request

from gateway.admission.config import AdminConfig, TenantConfig
from gateway.admission.tenants import ANONYMOUS, TenantRegistry
from gateway.errors import OpenAIError


def request_with(key: str | None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return make_mocked_request("POST", "/v1/chat/completions", headers=headers)


def registry(monkeypatch: pytest.MonkeyPatch) -> TenantRegistry:
    monkeypatch.setenv("KEY_B", "secret-b")
    return TenantRegistry(
        [
            TenantConfig(name="a", api_keys=["secret-a"], max_concurrency=1, isolate_cache=True),
            TenantConfig(name="b", api_keys=["${ENV:KEY_B}"], tokens_per_minute=100),
        ]
    )


def test_keys_pick_the_tenant_and_bad_keys_get_401(monkeypatch: pytest.MonkeyPatch) -> None:
    tenants = registry(monkeypatch)
    assert tenants.authenticate(request_with("secret-a")).name == "a"
    assert tenants.authenticate(request_with("secret-b")).name == "b"
    for key in (None, "wrong", "secret-ab"):
        with pytest.raises(OpenAIError) as error:
            tenants.authenticate(request_with(key))
        assert error.value.status == 401 and error.value.code == "invalid_api_key"


def test_open_gateway_without_tenants() -> None:
    assert TenantRegistry([]).authenticate(request_with(None)).name == ANONYMOUS


def test_env_reference_must_resolve_and_secrets_never_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVGATE_MISSING", raising=False)
    with pytest.raises(ValueError, match="KVGATE_MISSING"):
        TenantConfig(name="x", api_keys=["env:KVGATE_MISSING"])
    monkeypatch.setenv("KVGATE_ADMIN", "admin-secret")
    admin = AdminConfig(api_key="${ENV:KVGATE_ADMIN}")
    assert admin.api_key.get_secret_value() == "admin-secret"
    assert "admin-secret" not in repr(admin) and "admin-secret" not in str(admin.model_dump())


def test_duplicate_keys_or_names_are_refused() -> None:
    with pytest.raises(ValueError):
        TenantRegistry([TenantConfig(name="a", api_keys=["k"]), TenantConfig(name="b", api_keys=["k"])])
    with pytest.raises(ValueError):
        TenantRegistry([TenantConfig(name="a", api_keys=["k"]), TenantConfig(name="a", api_keys=["j"])])


def test_concurrency_and_token_budgets_answer_429(monkeypatch: pytest.MonkeyPatch) -> None:
    tenants = registry(monkeypatch)
    a, b = tenants.by_name["a"], tenants.by_name["b"]
    with a.admit(10):
        with pytest.raises(OpenAIError) as error, a.admit(10):
            pass
        assert error.value.status == 429 and error.value.code == "concurrency_limit_exceeded"
    with a.admit(10):
        pass
    with b.admit(80) as charge:
        charge.used = 30
    with b.admit(60) as charge:
        charge.used = 60
    with pytest.raises(OpenAIError) as error, b.admit(60):
        pass
    assert error.value.code == "tokens_per_minute_exceeded" and int(error.value.headers["Retry-After"]) >= 1


def test_isolated_tenant_gets_its_own_salt_and_usage_survives_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    tenants = registry(monkeypatch)
    a, b = tenants.by_name["a"], tenants.by_name["b"]
    assert b.cache_salt(None) is None and b.cache_salt("s") == "s"
    salt = a.cache_salt(None)
    assert salt and "secret-a" not in salt and a.cache_salt("s") == f"{salt}:s"
    with a.admit(1):
        reloaded = TenantRegistry([TenantConfig(name="a", api_keys=["secret-a"], max_concurrency=1)], tenants)
        assert reloaded.by_name["a"].usage.in_flight == 1


def test_a_request_that_fails_gives_its_tokens_back(monkeypatch: pytest.MonkeyPatch) -> None:
    b = registry(monkeypatch).by_name["b"]
    with pytest.raises(RuntimeError), b.admit(100):
        raise RuntimeError("backend gone")
    with b.admit(100):
        pass
