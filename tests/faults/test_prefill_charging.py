"""Engine work is charged: a client that leaves before any answer, or a replica that times out
before its first token, costs the tenant the prompt (real gateway, simulated engines with a slow prefill).

Each tenant has 1,200 tokens a minute and each request a ~910-token prompt: one charged prompt
leaves too little for the next request for about half a minute, while an uncharged one leaves
room for it at once.
"""

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.gateway_cluster import (
    MODEL,
    chat,
    gateway_config,
    gateway_for,
    logged_lines,
    post,
    running,
    start_engines,
    stream,
    wait_for_status,
)
from tests.procs import ManagedProcess, free_port

SLOW_PREFILL = ("--sim", "--sim-preset", "instant", "--sim-prefill-per-token-s", "0.004", "--max-model-len", "2048")
"""About 3.6 s to prefill the prompt below."""
PROMPT = "hello " * 900
FIRST_TOKEN_S = 1.5
TENANTS = ("left-whole", "left-stream", "timed-out")


def key(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tenant}-key"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("prefill_charging")
    with running(start_engines(tmp_path, 2, *SLOW_PREFILL)) as engines:
        tenants = [{"name": name, "api_keys": [f"{name}-key"], "tokens_per_minute": 1200} for name in TENANTS]
        config = gateway_config(
            free_port(),
            engines,
            tenants=tenants,
            timeouts={"first_token_s": FIRST_TOKEN_S},
            health={"interval_s": 0.5, "eject_after_failures": 1000},
        )
        with gateway_for(tmp_path, config) as gateway:
            yield gateway


def in_flight(status: dict) -> int:
    return sum(backend["in_flight"] for backend in status["backends"])


async def leave_once_forwarded(gateway: ManagedProcess, request: asyncio.Task) -> None:
    """Let ``request`` reach a replica, then drop its connection before any answer."""
    async with aiohttp.ClientSession() as session:
        await wait_for_status(session, gateway.url, lambda status: in_flight(status) == 1)
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        await wait_for_status(session, gateway.url, lambda status: in_flight(status) == 0)


async def next_request_status(gateway: ManagedProcess, tenant: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        status, _, body = await post(session, f"{gateway.url}/v1/chat/completions", chat(PROMPT, 4), key(tenant))
        return status, body


def assert_budget_spent(status: int, body: dict) -> None:
    assert status == 429 and body["error"]["code"] == "tokens_per_minute_exceeded", body


def logged(gateway: ManagedProcess, tenant: str, status: str) -> dict:
    """The request log line of ``tenant``'s request that ended with ``status``."""
    found = logged_lines(gateway.log, lambda line: line["tenant"] == tenant and line["status"] == status)
    assert found, f"no request log line of {tenant} with status {status}"
    return found[0]


async def test_a_client_that_leaves_a_whole_answer_before_it_comes_is_charged_its_prompt(
    gateway: ManagedProcess,
) -> None:
    session = aiohttp.ClientSession()
    url = f"{gateway.url}/v1/chat/completions"
    try:
        request = asyncio.create_task(post(session, url, chat(PROMPT, 4), key("left-whole")))
        await leave_once_forwarded(gateway, request)
    finally:
        await session.close()
    assert_budget_spent(*await next_request_status(gateway, "left-whole"))
    line = logged(gateway, "left-whole", "client_gone")
    assert line["completion_tokens"] is None and line["charged_tokens"] == line["prompt_tokens"] > 900


async def test_a_stream_that_leaves_before_its_first_token_is_charged_its_prompt(gateway: ManagedProcess) -> None:
    session = aiohttp.ClientSession()
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
    try:
        request = asyncio.create_task(stream(session, f"{gateway.url}/v1/completions", body, key("left-stream")))
        await leave_once_forwarded(gateway, request)
    finally:
        await session.close()
    assert_budget_spent(*await next_request_status(gateway, "left-stream"))


def failed_attempts(gateway: ManagedProcess) -> int:
    return gateway.log().count("before any byte")


async def test_a_first_token_timeout_is_a_504_not_retried_and_charged(gateway: ManagedProcess) -> None:
    attempts_before = failed_attempts(gateway)
    async with aiohttp.ClientSession() as session:
        body = chat(PROMPT, 4, max_completion_tokens=4)
        status, _, reply = await post(session, f"{gateway.url}/v1/chat/completions", body, key("timed-out"))
    assert status == 504 and reply["error"]["code"] == "upstream_timeout", reply
    assert failed_attempts(gateway) - attempts_before == 1, "one replica tried, not every one"
    assert_budget_spent(*await next_request_status(gateway, "timed-out"))
    assert logged(gateway, "timed-out", "504")["charged_tokens"] > 900
