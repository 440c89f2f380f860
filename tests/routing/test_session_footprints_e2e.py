"""Session footprints end to end: simulated engines with small caches, a gateway, real processes.

Conversations (each its own ``user``) share a system prompt that the first one puts on one replica.
With footprints on, once their turns have filled that replica's cache, new conversations start on
the other replica instead, paying for the system prompt once there; with them off, or without a
session key, every conversation stays with the system prompt. Those tests turn off
``spread_conversations``, which moves new conversations sooner (by how many each replica serves);
the last test shows that.
"""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_cluster import gateway_config, gateway_for, running, start_engine_set
from tests.procs import ManagedProcess, free_port, http
from tests.routing.test_e2e_routing import MODEL, text

NUM_BLOCKS = 32
"""512 tokens per replica: the system prompt and a handful of conversations' first turns."""
ENGINE = (
    *("--sim", "--sim-preset", "instant", "--sim-prefill-per-token-s", "0.001"),
    *("--num-blocks", str(NUM_BLOCKS), "--max-model-len", "512"),
)
"""Prefill at 1,000 tokens/s, so that the system prompt a replica lacks costs a tenth of a second."""
CONVERSATIONS = 8


def wait_until_routing_sees_idle_replicas(gateway: ManagedProcess) -> None:
    """Between conversations: the gateway polls the replicas' load every 50 ms, so that each routing
    decision sees idle replicas rather than a report taken while the previous turn ran."""
    deadline = time.monotonic() + 30
    while True:
        replicas = http("GET", f"{gateway.url}/dashboard/stats.json").json()["replicas"]
        if all(not (r["in_flight"] or r["num_running"] or r["num_waiting"]) for r in replicas):
            return
        assert time.monotonic() < deadline, f"replicas never reported idle: {replicas}"
        time.sleep(0.02)


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[ManagedProcess]]:
    """Fresh replicas for each test. An engine keeps the prefill rate it measured (the routing's price of
    a missed token) across ``/reset_prefix_cache``: replicas reused from an earlier test came with rates
    measured on other traffic and under other machine load, and a holder measured slower than the other
    replica lost conversations to it (a flake of the no-session-key case in a full run). A replica that
    has measured nothing is priced at the mean of those that have, so the holder's edge stays its cache."""
    with running(start_engine_set(tmp_path, [ENGINE, ENGINE])) as processes:
        yield processes


def open_conversations(
    engines: list[ManagedProcess], tmp_path: Path, footprints: bool, keyed: bool, spread: bool = False
) -> list[str]:
    """Each conversation's first turn, one after another; the replica each went to."""
    routing = {
        "policy": "cache_aware",
        "shared_prefix_requests": 1.0,
        "session_footprints": footprints,
        "spread_conversations": spread,
    }
    config = gateway_config(free_port(), engines, routing=routing)
    config["health"] = {"interval_s": 0.05}
    for backend in config["backends"]:
        backend["kv_capacity_blocks"] = NUM_BLOCKS
    system = text(500, 120)
    backends = []
    with gateway_for(tmp_path, config) as gateway:
        for number in range(CONVERSATIONS):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": text(number, 150)}]
            body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
            if keyed:
                body["user"] = f"user-{number}"
            reply = http("POST", f"{gateway.url}/v1/chat/completions", body)
            assert reply.status == 200, reply.body
            backends.append(reply.headers["x-kvgate-backend"])
            wait_until_routing_sees_idle_replicas(gateway)
    return backends


def test_new_conversations_start_elsewhere_once_the_system_prompt_s_replica_is_full(
    engines: list[ManagedProcess], tmp_path: Path
) -> None:
    backends = open_conversations(engines, tmp_path, footprints=True, keyed=True)
    holder = backends[0]
    assert backends[:3] == [holder] * 3, "the first conversations fit with the system prompt"
    assert len(set(backends)) == 2, f"later ones spread once the holder's cache is full: {backends}"


@pytest.mark.parametrize(("footprints", "keyed"), [(False, True), (True, False)], ids=["turned-off", "no-session-key"])
def test_without_footprints_every_conversation_stays_with_the_system_prompt(
    engines: list[ManagedProcess], tmp_path: Path, footprints: bool, keyed: bool
) -> None:
    backends = open_conversations(engines, tmp_path, footprints, keyed)
    assert backends == [backends[0]] * CONVERSATIONS


def test_spread_new_conversations_share_the_replicas_from_the_start(
    engines: list[ManagedProcess], tmp_path: Path
) -> None:
    """Each conversation's own 150 words cost more than the system prompt's 120, so one conversation
    on the holder is enough for the next to start on the other replica."""
    backends = open_conversations(engines, tmp_path, footprints=True, keyed=True, spread=True)
    assert len(set(backends[:3])) == 2, backends
    assert abs(backends.count(backends[0]) - CONVERSATIONS / 2) <= 1, backends
