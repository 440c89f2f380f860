"""Cache-aware routing end to end: simulated engines, a gateway, real processes on loopback.

Predicted mode: a multi-turn conversation stays on one replica, whose reported cached tokens
cover the earlier turns. Precise mode (engines publish KV events): the gateway's predicted
cached tokens equal the engine-reported ones for every request of a sequential run, with
eviction in play (the engines' caches are small).
"""

import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import zmq

from radix.kv_event_format import BlockRemoved, parse_frames
from tests.gateway_cluster import MODEL, gateway_config, gateway_for, running
from tests.procs import ManagedProcess, free_port, http, start_engine

NUM_BLOCKS = 32
"""512 tokens per replica: a few of the run's prompts fit, so the engines evict."""
SIM = ("--sim", "--sim-preset", "instant", "--num-blocks", str(NUM_BLOCKS), "--max-model-len", "512")
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
]


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def chat(messages: list[dict[str, str]], gateway: ManagedProcess) -> tuple[dict, dict[str, str]]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    reply = http("POST", f"{gateway.url}/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    return reply.json(), {key.lower(): value for key, value in reply.headers.items()}


def cached_tokens(completion: dict) -> int:
    return completion["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[ManagedProcess], list[str]]]:
    tmp_path = tmp_path_factory.mktemp("routing-engines")
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(3)]
    processes = start_engines_with_events(tmp_path, endpoints)
    with running(processes):
        yield processes, endpoints


def start_engines_with_events(tmp_path: Path, endpoints: list[str]) -> list[ManagedProcess]:
    """One engine per KV-event endpoint, started in parallel (each loads a tokenizer)."""
    with ThreadPoolExecutor(len(endpoints)) as pool:
        futures = [
            pool.submit(start_engine, tmp_path, *SIM, "--kv-events", endpoint, name=f"engine{index}")
            for index, endpoint in enumerate(endpoints)
        ]
    errors = [future.exception() for future in futures if future.exception() is not None]
    started = [future.result() for future in futures if future.exception() is None]
    if errors:
        for process in started:
            process.stop()
        raise errors[0]
    return started


@pytest.fixture
def predicted_gateway(engines: tuple[list[ManagedProcess], list[str]], tmp_path: Path) -> Iterator[ManagedProcess]:
    processes, _ = engines
    config = gateway_config(free_port(), processes, routing={"policy": "cache_aware"})
    for backend in config["backends"]:
        backend["kv_capacity_blocks"] = NUM_BLOCKS
    with gateway_for(tmp_path, config) as gateway:
        yield gateway


@pytest.fixture
def precise_gateway(engines: tuple[list[ManagedProcess], list[str]], tmp_path: Path) -> Iterator[ManagedProcess]:
    processes, endpoints = engines
    config = gateway_config(free_port(), processes, routing={"policy": "cache_aware"})
    for backend, endpoint in zip(config["backends"], endpoints, strict=False):
        backend["kv_events"] = endpoint
    with gateway_for(tmp_path, config) as gateway:
        yield gateway


def test_multi_turn_conversation_stays_on_its_replica(predicted_gateway: ManagedProcess) -> None:
    messages = [{"role": "system", "content": text(1, 80)}, {"role": "user", "content": text(2, 12)}]
    first, headers = chat(messages, predicted_gateway)
    home = headers["x-kvgate-backend"]
    previous_prompt = first["usage"]["prompt_tokens"]
    reply = first["choices"][0]["message"]["content"]
    for turn in range(3, 6):
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": text(turn, 10)}]
        completion, headers = chat(messages, predicted_gateway)
        assert headers["x-kvgate-backend"] == home
        assert headers["x-kvgate-route-reason"] == "prefix-hit"
        assert cached_tokens(completion) >= previous_prompt // 16 * 16
        assert int(headers["x-kvgate-predicted-cached-tokens"]) >= previous_prompt // 16 * 16
        previous_prompt = completion["usage"]["prompt_tokens"]
        reply = completion["choices"][0]["message"]["content"]


@pytest.mark.parametrize("infer", [True, False])
def test_a_follow_up_without_a_session_key_is_retained_by_its_engine(
    engines: tuple[list[ManagedProcess], list[str]], tmp_path: Path, infer: bool
) -> None:
    """The router names the conversation (gateway/routing/retention_keys.py) and the owner keeps its
    latest turn as a session's: its blocks are retained free blocks once the turn has finished."""
    processes, _ = engines
    for process in processes:
        assert http("POST", f"{process.url}/reset_prefix_cache", b"").status == 200
    config = gateway_config(free_port(), processes, routing={"policy": "cache_aware", "infer_retention_keys": infer})
    for backend in config["backends"]:
        backend["kv_capacity_blocks"] = NUM_BLOCKS
    with gateway_for(tmp_path, config) as gateway:
        messages = [{"role": "system", "content": text(11, 80)}, {"role": "user", "content": text(12, 12)}]
        first, _ = chat(messages, gateway)
        messages += [first["choices"][0]["message"], {"role": "user", "content": text(13, 10)}]
        _, headers = chat(messages, gateway)
        logged = request_log(gateway, lines=2)
    assert headers["x-kvgate-route-reason"] == "prefix-hit"
    assert [line["retention"] for line in logged] == [None, "inferred" if infer else None]
    home = processes[int(headers["x-kvgate-backend"].removeprefix("e"))]
    deadline = time.monotonic() + (5.0 if infer else 0.5)
    while not retained_free_blocks(home) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (retained_free_blocks(home) > 0) is infer


def request_log(gateway: ManagedProcess, lines: int) -> list[dict[str, Any]]:
    """The gateway's request log, once it has ``lines`` lines (each is written as its request ends)."""
    deadline = time.monotonic() + 5
    while True:
        logged = [json.loads(line) for line in gateway.log().splitlines() if line.startswith("{")]
        if len(logged) >= lines or time.monotonic() > deadline:
            return logged
        time.sleep(0.05)


def retained_free_blocks(engine: ManagedProcess) -> int:
    reply = http("GET", f"{engine.url}/stats")
    assert reply.status == 200, reply.body
    return reply.json()["retained_free_blocks"]


def test_precise_mode_predicts_engine_reported_cached_tokens(
    precise_gateway: ManagedProcess, engines: tuple[list[ManagedProcess], list[str]]
) -> None:
    """After each answer the run waits until the gateway has read every KV event published so far."""
    systems = [text(100 + group, 50 + 20 * group) for group in range(6)]
    rng = random.Random(7)
    outcomes = []
    with EventWatch(engines[1]) as watch:
        follow_every_engine(precise_gateway, engines[0], watch)
        baseline = gateway_event_batches(precise_gateway)
        for step in range(30):
            group = rng.randrange(len(systems))
            question = text(1000 + rng.randrange(6), 10)
            messages = [{"role": "system", "content": systems[group]}, {"role": "user", "content": question}]
            completion, headers = chat(messages, precise_gateway)
            predicted = int(headers["x-kvgate-predicted-cached-tokens"])
            outcomes.append((step, headers["x-kvgate-backend"], predicted, cached_tokens(completion)))
            published = watch.drain()
            deadline = time.monotonic() + 10
            while gateway_event_batches(precise_gateway) - baseline < published:
                assert time.monotonic() < deadline, "the gateway fell behind the engines' KV events"
                time.sleep(0.01)
        assert watch.removed_blocks > 0, "the engines evicted blocks during the run"
    assert [(s, b, p) for s, b, p, _ in outcomes] == [(s, b, c) for s, b, _, c in outcomes]
    assert sum(1 for *_, cached in outcomes if cached) >= 8, "the run exercises cache hits"
    assert len({backend for _, backend, *_ in outcomes}) >= 2, "new prefixes spread over replicas"


def gateway_event_batches(gateway: ManagedProcess) -> int:
    return sum(gateway_batches_by_backend(gateway).values())


def gateway_batches_by_backend(gateway: ManagedProcess) -> dict[str, int]:
    reply = http("GET", f"{gateway.url}/dashboard/stats.json")
    assert reply.status == 200, reply.body
    stats: Any = reply.json()
    return {name: counters["received"] for name, counters in stats["prefix_index"]["index"]["kv_events"].items()}


def follow_every_engine(gateway: ManagedProcess, processes: list[ManagedProcess], watch: "EventWatch") -> None:
    """Reset the engines' caches until the gateway and the watch both receive each engine's events.

    ZMQ subscribers connect asynchronously (the slow joiner), so this waits on delivery, not on
    time. The gateway subscribed before the watch, so it receives at least what the watch did;
    once it has, the two count the same batches from here on and the watch starts again at 0.
    """
    names = [f"e{index}" for index in range(len(processes))]
    before = gateway_batches_by_backend(gateway)
    deadline = time.monotonic() + 20
    while True:
        watch.drain()
        received = gateway_batches_by_backend(gateway)
        lagging = [
            index
            for index, name in enumerate(names)
            if not watch.batches_from[index] or received.get(name, 0) == before.get(name, 0)
        ]
        if not lagging:
            break
        assert time.monotonic() < deadline, f"no KV events from engines {lagging} after 20 s of cache resets"
        for index in lagging:
            assert http("POST", f"{processes[index].url}/reset_prefix_cache", b"").status == 200
    while any(received[name] - before.get(name, 0) < watch.batches_from[index] for index, name in enumerate(names)):
        assert time.monotonic() < deadline, "the gateway fell behind the engines' KV events"
        time.sleep(0.01)
        received = gateway_batches_by_backend(gateway)
    watch.restart_counts()


class EventWatch:
    """The test's own subscription to each engine's KV events: batches published, blocks evicted."""

    def __init__(self, endpoints: list[str]) -> None:
        self._sockets: list[zmq.Socket] = []
        self._poller = zmq.Poller()
        for endpoint in endpoints:
            socket: zmq.Socket = zmq.Context.instance().socket(zmq.SUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(endpoint)
            self._poller.register(socket, zmq.POLLIN)
            self._sockets.append(socket)
        self.batches_from = [0] * len(endpoints)
        self.removed_blocks = 0

    def __enter__(self) -> "EventWatch":
        return self

    def __exit__(self, *exc_info: object) -> None:
        for socket in self._sockets:
            socket.close()

    def restart_counts(self) -> None:
        self.batches_from = [0] * len(self._sockets)
        self.removed_blocks = 0

    def drain(self) -> int:
        """Read what has arrived (waiting briefly for stragglers); returns the batches seen so far."""
        while ready := dict(self._poller.poll(50)):
            for index, socket in enumerate(self._sockets):
                if socket in ready:
                    _, batch = parse_frames(socket.recv_multipart())
                    self.batches_from[index] += 1
                    self.removed_blocks += sum(len(e.block_hashes) for e in batch.events if isinstance(e, BlockRemoved))
        return sum(self.batches_from)
