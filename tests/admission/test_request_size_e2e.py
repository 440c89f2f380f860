"""One request must not reserve a whole replica or a whole budget (a real gateway before a simulated engine).

`max_n` bounds samples per request; a request more tokens than the tenant's whole per-minute
budget is a 400 instead of a debt; a request whose KV blocks exceed every replica is a 400 at
once instead of a wait; embeddings reserve no KV and have an input-token cap.
"""

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.gateway_cluster import (
    MODEL,
    SLOW_SIM,
    chat,
    gateway_config,
    gateway_for,
    get_json,
    post,
    running,
    start_engines,
    stream,
    wait_for_status,
)
from tests.procs import ManagedProcess, free_port

NUM_BLOCKS = 256
CAPPED = {"Authorization": "Bearer capped-key"}
OPEN = {"Authorization": "Bearer open-key"}
TENANTS = [
    {
        "name": "capped",
        "api_keys": ["capped-key"],
        "tokens_per_minute": 1000,
        "limits": {"max_tokens": 256, "max_tokens_policy": "clamp", "max_n": 8},
    },
    {"name": "open", "api_keys": ["open-key"]},
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("request_size")
    flags = (*SLOW_SIM, "--num-blocks", str(NUM_BLOCKS), "--max-model-len", "2048")
    with running(start_engines(tmp_path, 1, *flags)) as engines:
        config = gateway_config(free_port(), engines, tenants=TENANTS, limits={"max_embedding_input_tokens": 100_000})
        with gateway_for(tmp_path, config) as gateway:
            yield gateway


async def call(gateway: ManagedProcess, path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        await wait_for_status(session, gateway.url, lambda status: status["backends"][0]["kv_capacity_blocks"])
        status, _, reply = await post(session, f"{gateway.url}{path}", body, headers)
        return status, reply


async def test_more_samples_than_max_n_is_a_400_naming_n(gateway: ManagedProcess) -> None:
    body = {"model": MODEL, "prompt": "Count.", "n": 9, "max_completion_tokens": 4}
    status, reply = await call(gateway, "/v1/completions", body, CAPPED)
    assert status == 400 and reply["error"]["param"] == "n" and reply["error"]["code"] == "n_too_large", reply
    status, reply = await call(gateway, "/v1/completions", {**body, "n": 1, "best_of": 9}, CAPPED)
    assert status == 400 and reply["error"]["code"] == "n_too_large" and "9 samples" in reply["error"]["message"]
    status, reply = await call(gateway, "/v1/completions", {**body, "n": 8}, CAPPED)
    assert status == 200 and len(reply["choices"]) == 8, reply


async def test_a_request_over_the_whole_token_budget_is_refused_without_debt(gateway: ManagedProcess) -> None:
    """8 samples clamped to 256 tokens need 2,048 tokens of a 1,000-token budget: never admissible."""
    status, reply = await call(gateway, "/v1/chat/completions", chat("hi", 500, n=8, stream=True), CAPPED)
    assert status == 400 and reply["error"]["code"] == "tokens_exceed_budget", reply
    assert "1000 tokens per minute" in reply["error"]["message"]
    status, reply = await call(gateway, "/v1/chat/completions", chat("hi", 50, n=2), CAPPED)
    assert status == 200, "nothing was taken from the budget: the refusal left no debt"


async def test_a_request_no_replica_can_hold_is_refused_at_once(gateway: ManagedProcess) -> None:
    """4 x 1,200 completion tokens need 300+ blocks of 16 tokens; the only replica holds 256."""
    body = chat("hi", 1200, n=4, ignore_eos=True)
    status, reply = await call(gateway, "/v1/chat/completions", body, OPEN)
    assert status == 400 and reply["error"]["code"] == "kv_capacity_exceeded", reply
    assert f"holds {NUM_BLOCKS}" in reply["error"]["message"]
    async with aiohttp.ClientSession() as session:
        backends = await get_json(session, f"{gateway.url}/admin/backends")
    assert backends["backends"][0]["kv_reserved_blocks"] == 0 and not backends["queued"]
    status, reply = await call(gateway, "/v1/chat/completions", chat("hi", 8, n=4), OPEN)
    assert status == 200 and len(reply["choices"]) == 4


async def test_embeddings_reserve_no_kv_and_have_an_input_token_cap(gateway: ManagedProcess) -> None:
    over_cap = {"model": MODEL, "input": [[7] * 100] * 1001}
    status, reply = await call(gateway, "/v1/embeddings", over_cap, OPEN)
    assert status == 400 and reply["error"]["code"] == "too_many_input_tokens", reply
    assert "100100 input tokens" in reply["error"]["message"]
    larger_than_the_replica = {"model": MODEL, "input": [[7] * 400] * 16}
    async with aiohttp.ClientSession() as session:
        holder = asyncio.create_task(
            stream(session, f"{gateway.url}/v1/chat/completions", chat("a long answer", 1000, ignore_eos=True), OPEN)
        )
        reserved = await wait_for_status(
            session, gateway.url, lambda status: status["backends"][0]["kv_reserved_blocks"] > 0
        )
        url = f"{gateway.url}/v1/embeddings"
        replies = await asyncio.gather(*(post(session, url, larger_than_the_replica, OPEN) for _ in range(3)))
        assert not holder.done(), "6,400 input tokens (400 blocks) did not wait for the stream's KV to come back"
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
    assert [status for status, _, _ in replies] == [200] * 3, replies[0][2]
    assert all(len(reply["data"]) == 16 for _, _, reply in replies)
    assert reserved["backends"][0]["kv_reserved_blocks"] < NUM_BLOCKS
