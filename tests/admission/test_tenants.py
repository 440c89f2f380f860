"""Tenants: API keys (inline or from the environment), budgets, cache salts, admin access."""

import pytest
from aiohttp.test_utils import make_mocked_request

from gateway.admission.config import AdminConfig, TenantConfig
from gateway.admission.tenants import ANONYMOUS, PRIORITY_HEADER, Tenant, TenantRegistry
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


async def test_concurrency_and_token_budgets_answer_429(monkeypatch: pytest.MonkeyPatch) -> None:
    tenants = registry(monkeypatch)
    a, b = tenants.by_name["a"], tenants.by_name["b"]
    async with a.admit(10):
        with pytest.raises(OpenAIError) as error:
            async with a.admit(10):
                pass
        assert error.value.status == 429 and error.value.code == "concurrency_limit_exceeded"
    async with a.admit(10):
        pass
    async with b.admit(80) as charge:
        charge.used = 30
    async with b.admit(60) as charge:
        charge.used = 60
    with pytest.raises(OpenAIError) as error:
        async with b.admit(60):
            pass
    assert error.value.code == "tokens_per_minute_exceeded" and int(error.value.headers["Retry-After"]) >= 1


async def test_requests_per_minute_counts_requests_and_a_refusal_takes_nothing() -> None:
    tenants = TenantRegistry([TenantConfig(name="r", api_keys=["k"], requests_per_minute=2, tokens_per_minute=100)])
    r = tenants.by_name["r"]
    for _ in range(2):
        async with r.admit(1):
            pass
    with pytest.raises(OpenAIError) as error:
        async with r.admit(1):
            pass
    assert error.value.code == "requests_per_minute_exceeded" and int(error.value.headers["Retry-After"]) >= 1
    assert r.usage.tokens is not None and r.usage.tokens.wait_s(98) == 0.0, "the refused request took no tokens"
    assert r.usage.in_flight == 0


async def test_isolated_tenant_gets_its_own_salt_and_usage_survives_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    tenants = registry(monkeypatch)
    a, b = tenants.by_name["a"], tenants.by_name["b"]
    assert b.cache_salt(None) is None and b.cache_salt("s") == "s"
    salt = a.cache_salt(None)
    assert salt and "secret-a" not in salt and a.cache_salt("s") == f"{salt}:s"
    async with a.admit(1):
        reloaded = TenantRegistry([TenantConfig(name="a", api_keys=["secret-a"], max_concurrency=1)], tenants)
        assert reloaded.by_name["a"].usage.in_flight == 1


async def test_a_request_that_fails_gives_its_tokens_back(monkeypatch: pytest.MonkeyPatch) -> None:
    b = registry(monkeypatch).by_name["b"]
    with pytest.raises(RuntimeError):
        async with b.admit(100):
            raise RuntimeError("backend gone")
    async with b.admit(100):
        pass


def test_priority_comes_from_the_tenant_or_an_allowed_header() -> None:
    fixed = Tenant("batch", TenantConfig(name="batch", api_keys=["k1"], priority=-1))
    chooser = Tenant("app", TenantConfig(name="app", api_keys=["k2"], priority=1, max_header_priority=5))
    assert fixed.priority({}) == -1 and chooser.priority({}) == 1
    assert chooser.priority({PRIORITY_HEADER: "4"}) == 4
    for tenant, value in ((fixed, "3"), (chooser, "6"), (chooser, "high")):
        with pytest.raises(OpenAIError) as error:
            tenant.priority({PRIORITY_HEADER: value})
        assert error.value.status == 400


async def test_a_request_over_the_whole_token_budget_is_a_400_and_takes_nothing() -> None:
    tenant = TenantRegistry([TenantConfig(name="t", api_keys=["k"], tokens_per_minute=1000)]).by_name["t"]
    for take in (tenant.charge, tenant.admit):
        with pytest.raises(OpenAIError) as error:
            async with take(1001):
                pass
        assert error.value.status == 400 and error.value.code == "tokens_exceed_budget"
    async with tenant.admit(1000):
        pass
