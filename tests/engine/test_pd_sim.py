"""Disaggregated prefill/decode between --sim engines: the same flag and protocol, a transfer
that takes its bytes over the configured bandwidth, a client that leaves mid-transfer, and a
hold nobody pulls, freed after its timeout. Every engine checks its block invariants each step."""

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from protocol.replica_stats import decode_stats
from tests.procs import ManagedProcess, free_port, http, start_engine

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
BLOCK = 16
NUM_BLOCKS = 600
BYTES_PER_BLOCK = 46_080 * BLOCK
"""SmolLM2-135M's float32 KV (planner.kv_math) for one block."""
BANDWIDTH_GBS = 0.05
SIM = ("--sim", "--sim-preset", "instant", "--num-blocks", str(NUM_BLOCKS), "--max-model-len", "4096",
       "--check-invariants")  # fmt: skip
PREFILL_LEG = {"do_remote_decode": True, "do_remote_prefill": False}


def connector(**extra: float) -> tuple[str, str]:
    config = {"kv_role": "kv_both", "kv_port": free_port(), "kv_connector_extra_config": extra}
    return ("--kv-transfer-config", orjson.dumps(config).decode())


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ManagedProcess]]:
    tmp = tmp_path_factory.mktemp("pd-sim")
    started = {
        "prefill": start_engine(tmp, *SIM, *connector(sim_bandwidth_gbs=BANDWIDTH_GBS), name="prefill"),
        "decode": start_engine(tmp, *SIM, *connector(sim_bandwidth_gbs=BANDWIDTH_GBS), name="decode"),
        "short_hold": start_engine(tmp, *SIM, *connector(hold_timeout_s=2), name="short-hold"),
    }
    yield started
    for engine in started.values():
        engine.stop()


def prompt(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 37) % 40000 + 100 for i in range(length)]


def post(engine: ManagedProcess, body: dict[str, Any]) -> dict[str, Any]:
    reply = http("POST", f"{engine.url}/v1/completions", {"model": MODEL, "temperature": 0, **body}, timeout=120)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert isinstance(answer, dict)
    return answer


def free_blocks(engine: ManagedProcess) -> int:
    return decode_stats(http("GET", f"{engine.url}/stats").body).free_blocks


def wait_until(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still not {what} after {timeout} s"
        time.sleep(0.1)


def pulled(engine: ManagedProcess) -> float:
    text = http("GET", f"{engine.url}/metrics").body.decode()
    line = next(
        line for line in text.splitlines() if line.startswith("kvgate:kv_transfer_blocks_total{") and "pulled" in line
    )
    return float(line.rsplit(" ", 1)[1])


def test_the_decode_leg_waits_for_the_transfer_and_counts_it_cached(engines: dict[str, ManagedProcess]) -> None:
    prefill, decode = engines["prefill"], engines["decode"]
    tokens = prompt(1, 800)
    blocks = (len(tokens) - 1) // BLOCK
    cost = blocks * BYTES_PER_BLOCK / (BANDWIDTH_GBS * 1e9)
    started = time.monotonic()
    post(decode, {"prompt": prompt(2, 800), "max_tokens": 4})
    local = time.monotonic() - started
    first = post(prefill, {"prompt": tokens, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})
    assert len(first["kv_transfer_params"]["remote_block_ids"]) == blocks
    assert free_blocks(prefill) == NUM_BLOCKS - blocks, "the prompt's blocks are held"
    started = time.monotonic()
    answer = post(decode, {"prompt": tokens, "max_tokens": 4, "kv_transfer_params": first["kv_transfer_params"]})
    remote = time.monotonic() - started
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == blocks * BLOCK
    assert remote >= cost, f"a {cost:.2f} s transfer answered in {remote:.2f} s"
    assert remote <= 4 * (local + cost), f"local prefill {local:.2f} s, transfer {cost:.2f} s, took {remote:.2f} s"
    wait_until(lambda: free_blocks(prefill) == NUM_BLOCKS, "freed on the prefill engine")
    assert free_blocks(decode) == NUM_BLOCKS


def test_a_client_leaving_mid_transfer_frees_both_engines(engines: dict[str, ManagedProcess]) -> None:
    """3,000 tokens = 187 blocks = 2.8 s over 0.05 GB/s: the client leaves after 0.5 s."""
    prefill, decode = engines["prefill"], engines["decode"]
    tokens = prompt(3, 3000)
    first = post(prefill, {"prompt": tokens, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})
    assert free_blocks(prefill) < NUM_BLOCKS
    pulled_before = pulled(decode)

    async def leave_early() -> None:
        body = {"model": MODEL, "prompt": tokens, "max_tokens": 4, "kv_transfer_params": first["kv_transfer_params"]}
        async with aiohttp.ClientSession() as session:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await session.post(f"{decode.url}/v1/completions", json=body)

    asyncio.run(leave_early())
    wait_until(lambda: free_blocks(prefill) == NUM_BLOCKS, "freed on the prefill engine")
    wait_until(lambda: free_blocks(decode) == NUM_BLOCKS, "freed on the decode engine")
    assert pulled(decode) == pulled_before, "the pull never completed"
    again = post(decode, {"prompt": prompt(4, 40), "max_tokens": 2})
    assert again["usage"]["completion_tokens"] == 2, "the decode engine still serves"


def test_a_hold_nobody_pulls_is_freed_after_its_timeout(engines: dict[str, ManagedProcess]) -> None:
    engine = engines["short_hold"]
    first = post(engine, {"prompt": prompt(5, 400), "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})
    held = len(first["kv_transfer_params"]["remote_block_ids"])
    assert held == (400 - 1) // BLOCK
    held_at = time.monotonic()
    free_now = free_blocks(engine)
    if time.monotonic() - held_at < 1.0:
        assert free_now == NUM_BLOCKS - held, "the prompt's blocks are held"
    wait_until(lambda: free_blocks(engine) == NUM_BLOCKS, "freed after the hold timeout")
    assert time.monotonic() - held_at >= 1.0
    text = http("GET", f"{engine.url}/metrics").body.decode()
    assert 'kvgate:kv_transfer_holds_expired_total{model_name="smollm2-135m"} 1.0' in text
