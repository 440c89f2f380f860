"""A request that arrives while another is prefilling its prefix, end to end: two simulated engines
that prefill in 64-token chunks and publish KV events, a gateway following them, real processes on
loopback. The engine publishes each chunk's blocks as they are computed, so mid-prefill the
gateway's index holds the first chunks and only its own speculative entries cover the rest
(``CacheTracker._speculative_depths``): the follow-up must see the whole shared prefix there, go to
that replica and be told the cached tokens the engine then reports."""

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.gateway_cluster import MODEL, gateway_config, gateway_for, running, start_publishing_engines
from tests.procs import ManagedProcess, free_port, http
from tests.routing.test_e2e_routing import gateway_batches_by_backend, text

CHUNK_TOKENS = 64
SIM = (
    "--sim", "--sim-preset", "instant", "--sim-prefill-per-token-s", "0.003",
    "--max-num-batched-tokens", str(CHUNK_TOKENS), "--max-model-len", "4096",
)  # fmt: skip
"""About 0.2 s a chunk: a 1,300-token prompt is mid-prefill for about 4 s."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("mid-prefill")
    engines, endpoints = start_publishing_engines(tmp_path, 2, *SIM)
    with running(engines):
        config = gateway_config(free_port(), engines, routing={"policy": "cache_aware"})
        for backend, endpoint in zip(config["backends"], endpoints, strict=True):
            backend["kv_events"] = endpoint
        with gateway_for(tmp_path, config) as gateway:
            subscribe(gateway, engines)
            yield gateway


def subscribe(gateway: ManagedProcess, engines: list[ManagedProcess]) -> None:
    """Reset the engines' caches until the gateway has an event batch from each (ZMQ's slow joiner)."""
    deadline = time.monotonic() + 20
    while len([count for count in gateway_batches_by_backend(gateway).values() if count]) < len(engines):
        assert time.monotonic() < deadline, "the gateway receives no KV events"
        for engine in engines:
            assert http("POST", f"{engine.url}/reset_prefix_cache", b"").status == 200
        time.sleep(0.1)


def index_blocks(gateway: ManagedProcess) -> dict[str, int]:
    reply = http("GET", f"{gateway.url}/dashboard/stats.json")
    stats: Any = reply.json()
    return {name: entry["blocks"] for name, entry in stats["prefix_index"]["index"]["per_replica"].items()}


def chat(gateway: ManagedProcess, system: str, user: str) -> tuple[dict[str, Any], dict[str, str]]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
    }
    reply = http("POST", f"{gateway.url}/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    completion: Any = reply.json()
    return completion, {key.lower(): value for key, value in reply.headers.items()}


def test_a_follow_up_sent_mid_prefill_goes_where_its_prefix_is_being_computed(fleet: ManagedProcess) -> None:
    system = text(500, 1300)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, fleet, system, text(501, 12))
        deadline = time.monotonic() + 10
        while not any(index_blocks(fleet).values()):
            assert time.monotonic() < deadline, "no chunk of the first prompt was stored"
            time.sleep(0.02)
        stored = max(index_blocks(fleet).values())
        assert not first.done(), "the first prompt is still being prefilled"
        follow_up, follow_up_headers = chat(fleet, system, text(502, 12))
        first_completion, first_headers = first.result()
    shared = follow_up["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert follow_up_headers["x-kvgate-backend"] == first_headers["x-kvgate-backend"]
    assert follow_up_headers["x-kvgate-route-reason"] == "prefix-hit"
    assert shared > 10 * stored * 16, f"the engine reused the whole shared prefix, not the {stored} blocks stored"
    assert int(follow_up_headers["x-kvgate-predicted-cached-tokens"]) == shared
    assert first_completion["usage"]["prompt_tokens"] > shared
