"""Tenants through a real gateway: API keys, budgets, cache isolation, admin access."""

import asyncio
import os
from collections.abc import Iterator

import aiohttp
import pytest

from tests.gateway_cluster import (
    MODEL,
    SLOW_SIM,
    chat,
    gateway_with_engines,
    post,
    stream,
    wait_for_status,
)
from tests.procs import ManagedProcess

ENV_KEY = "KVGATE_TEST_BETA_KEY"
TENANTS = [
    {"name": "alpha", "api_keys": ["key-alpha"], "isolate_cache": True},
    {"name": "beta", "api_keys": [f"${{ENV:{ENV_KEY}}}"]},
    {"name": "gamma", "api_keys": ["key-gamma"]},
    {"name": "solo", "api_keys": ["key-solo"], "max_concurrency": 1},
    {"name": "metered", "api_keys": ["key-metered"], "tokens_per_minute": 300},
]
SHARED_PREFIX = "You are a careful assistant. " * 30


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    os.environ[ENV_KEY] = "key-beta"
    try:
        with gateway_with_engines(
            tmp_path_factory.mktemp("tenants"), [SLOW_SIM], tenants=TENANTS, admin={"api_key": "key-admin"}
        ) as gateway:
            yield gateway
    finally:
        del os.environ[ENV_KEY]


async def call(gateway: ManagedProcess, key: str | None, body: dict, path: str = "/v1/chat/completions") -> tuple:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session:
        return await post(session, f"{gateway.url}{path}", body, headers)


def cached_tokens(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("key", [None, "key-wrong", "key-alph"])
async def test_missing_or_wrong_key_is_401(gateway: ManagedProcess, key: str | None) -> None:
    status, headers, body = await call(gateway, key, chat("hello"))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert "key-alpha" not in str(body) and "WWW-Authenticate" in headers
    assert "key-wrong" not in gateway.log()


async def test_key_from_the_environment_works(gateway: ManagedProcess) -> None:
    status, _, _ = await call(gateway, "key-beta", chat("hello"))
    assert status == 200


def completion(prompt: str) -> dict:
    """A raw-prompt request: no chat template, so its first block is its own."""
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2}


async def test_isolated_tenant_shares_no_cache(gateway: ManagedProcess) -> None:
    prompt = "Isolated. " + SHARED_PREFIX
    for _ in range(2):
        status, _, alpha = await call(gateway, "key-alpha", completion(prompt), "/v1/completions")
        assert status == 200
    assert cached_tokens(alpha) > 0, "alpha hits its own cache"
    status, _, beta = await call(gateway, "key-beta", completion(prompt), "/v1/completions")
    assert status == 200 and cached_tokens(beta) == 0


async def test_tenants_without_isolation_share_the_cache(gateway: ManagedProcess) -> None:
    prompt = "Shared. " + SHARED_PREFIX
    status, _, beta = await call(gateway, "key-beta", completion(prompt), "/v1/completions")
    assert status == 200 and cached_tokens(beta) == 0
    status, _, gamma = await call(gateway, "key-gamma", completion(prompt), "/v1/completions")
    assert status == 200 and cached_tokens(gamma) > 0


async def test_tenant_concurrency_limit_is_429(gateway: ManagedProcess) -> None:
    headers = {"Authorization": "Bearer key-solo"}
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer key-admin"}) as session:
        url = f"{gateway.url}/v1/chat/completions"
        holder = asyncio.create_task(stream(session, url, chat("hold", 40, ignore_eos=True), headers))
        await wait_for_status(session, gateway.url, lambda status: status["tenants_in_flight"].get("solo") == 1)
        status, reply_headers, body = await post(session, url, chat("second"), headers)
        held_status, _ = await holder
    assert held_status == 200
    assert status == 429 and body["error"]["code"] == "concurrency_limit_exceeded" and reply_headers["Retry-After"]
    status, _, _ = await call(gateway, "key-solo", chat("after"))
    assert status == 200


async def test_tokens_per_minute_budget_is_429(gateway: ManagedProcess) -> None:
    statuses = []
    for index in range(6):
        status, headers, body = await call(gateway, "key-metered", chat(f"metered {index}", 40, ignore_eos=True))
        statuses.append(status)
    assert statuses[0] == 200 and statuses[-1] == 429, statuses
    assert body["error"]["code"] == "tokens_per_minute_exceeded" and int(headers["Retry-After"]) >= 1


async def test_admin_endpoints_need_the_admin_key(gateway: ManagedProcess) -> None:
    status, _, body = await call(gateway, None, {}, "/admin/reload")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, _, body = await call(gateway, "key-alpha", {}, "/admin/reload")
    assert status == 401
    status, _, body = await call(gateway, "key-admin", {}, "/admin/reload")
    assert status == 200 and body["status"] == "reloaded"


async def test_model_list_needs_a_key_too(gateway: ManagedProcess) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{gateway.url}/v1/models") as reply:
            assert reply.status == 401
        async with session.get(f"{gateway.url}/v1/models", headers={"Authorization": "Bearer key-gamma"}) as reply:
            assert reply.status == 200 and (await reply.json())["data"][0]["id"] == MODEL
