"""Caps and the admission queue through a real gateway in front of a simulated engine."""

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest

from tests.gateway_cluster import (
    SLOW_SIM,
    chat,
    gateway_with_engines,
    post,
    stream,
    wait_for_status,
)
from tests.procs import ManagedProcess

MAX_CONCURRENCY = 2
MAX_QUEUE = 2
QUEUE_TIMEOUT_S = 0.6
LIMITS = {
    "max_prompt_tokens": 200,
    "max_tokens": 64,
    "max_queue": MAX_QUEUE,
    "queue_timeout_s": QUEUE_TIMEOUT_S,
    "models": {"smollm2-135m": {"context_length": 256}},
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    with gateway_with_engines(
        tmp_path_factory.mktemp("limits"), [SLOW_SIM], every_backend={"max_concurrency": MAX_CONCURRENCY}, limits=LIMITS
    ) as gateway:
        yield gateway


async def call(gateway: ManagedProcess, body: dict) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as session:
        return await post(session, f"{gateway.url}/v1/chat/completions", body)


def assert_openai_error(status: int, body: dict, expected: int, code: str) -> None:
    assert status == expected, body
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == code


async def test_prompt_over_the_cap_is_400_with_both_numbers(gateway: ManagedProcess) -> None:
    status, _, body = await call(gateway, chat("word " * 300))
    assert_openai_error(status, body, 400, "prompt_too_long")
    assert "200" in body["error"]["message"]


async def test_max_tokens_over_the_cap_is_400(gateway: ManagedProcess) -> None:
    status, _, body = await call(gateway, chat("hello", max_tokens=65))
    assert_openai_error(status, body, 400, "max_tokens_too_large")


async def test_prompt_plus_max_tokens_over_the_context_is_400(gateway: ManagedProcess) -> None:
    status, _, body = await call(gateway, chat("word " * 164, max_tokens=64))
    assert_openai_error(status, body, 400, "context_length_exceeded")
    assert "maximum context length is 256 tokens" in body["error"]["message"]


async def test_n_samples_are_capped_per_sample_and_n_is_bounded(gateway: ManagedProcess) -> None:
    status, _, body = await call(gateway, chat("word " * 150, n=3, max_tokens=64, ignore_eos=True))
    assert status == 200 and sorted(choice["index"] for choice in body["choices"]) == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 3 * 64, "the 200-token prompt cap counts the prompt once"
    status, _, body = await call(gateway, chat("hello", n=129))
    assert status == 400 and body["error"]["param"] == "n"


async def test_n_samples_reserve_kv_for_every_sample(gateway: ManagedProcess) -> None:
    async with aiohttp.ClientSession() as session:
        body = chat("hello", max_tokens=64, n=4, ignore_eos=True)
        running_request = asyncio.create_task(stream(session, f"{gateway.url}/v1/chat/completions", body))
        status = await wait_for_status(session, gateway.url, lambda status: status["backends"][0]["in_flight"] == 1)
        code, events = await running_request
    assert status["backends"][0]["kv_reserved_blocks"] >= 4 * 64 // 16, "n x max_tokens output blocks are reserved"
    assert code == 200 and events[-1] == b"[DONE]"


async def test_request_without_max_tokens_gets_the_cap(gateway: ManagedProcess) -> None:
    body = chat("hello", ignore_eos=True)
    del body["max_tokens"]
    status, _, reply = await call(gateway, body)
    assert status == 200 and reply["usage"]["completion_tokens"] == 64


async def test_burst_of_three_times_capacity_completes_or_gets_a_fast_429(gateway: ManagedProcess) -> None:
    """A full queue rejects at once: every 429 arrives before the first admitted request has finished.

    Each admitted request decodes 20 tokens (0.4 s of simulated time at the least). A queued one may
    also run out its 0.6 s queue timeout behind the others on a slow machine: a 503, not a failure.
    """
    capacity = MAX_CONCURRENCY + MAX_QUEUE

    async def one(session: aiohttp.ClientSession, index: int) -> tuple[int, dict, float]:
        status, headers, _ = await post(session, f"{gateway.url}/v1/chat/completions", chat(f"burst {index}", 20))
        return status, headers, time.perf_counter()

    async with aiohttp.ClientSession() as session:
        results = await asyncio.wait_for(asyncio.gather(*(one(session, i) for i in range(3 * capacity))), 30)
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 429, 503}, statuses
    assert statuses.count(200) >= MAX_CONCURRENCY
    rejected = [(headers, finished) for status, headers, finished in results if status == 429]
    first_completion = min(finished for status, _, finished in results if status == 200)
    assert rejected and all(headers["Retry-After"] == "1" for headers, _ in rejected)
    assert all(finished < first_completion for _, finished in rejected)


async def test_waiting_past_the_queue_timeout_is_503(gateway: ManagedProcess) -> None:
    async with aiohttp.ClientSession() as session:
        url = f"{gateway.url}/v1/chat/completions"
        holders = [asyncio.create_task(stream(session, url, chat(f"hold {i}", 64, ignore_eos=True))) for i in range(2)]
        await wait_for_status(session, gateway.url, lambda status: status["backends"][0]["in_flight"] == 2)
        started = time.perf_counter()
        status, headers, body = await post(session, url, chat("late"))
        waited = time.perf_counter() - started
        holders_done_before_the_503 = [holder.done() for holder in holders]
        await asyncio.gather(*holders)
    assert_openai_error(status, body, 503, "service_unavailable")
    assert "queue timeout" in body["error"]["message"] and headers["Retry-After"] == "1"
    assert waited >= QUEUE_TIMEOUT_S, "the request waited its whole queue timeout"
    assert holders_done_before_the_503 == [False, False], "it gave up while both slots were still held (1.28 s)"


async def test_body_over_the_size_limit_is_413(gateway: ManagedProcess) -> None:
    status, _, body = await call(gateway, chat("x" * (9 << 20)))
    assert status == 413 and "error" in body


async def test_unknown_fields_are_ignored(gateway: ManagedProcess) -> None:
    status, _, body = await call(gateway, chat("hello", 4, frobnicate={"deep": [1, 2]}, logit_bias={"1": 0}))
    assert status == 200 and body["choices"]
