"""The host tier and retention hints through a real simulated engine process over loopback."""

import json
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import zmq

from radix.hashing import block_hashes
from radix.kv_event_format import MEDIUM_CPU, AllBlocksCleared, BlockStored, parse_frames, wire_block_hash
from tests.engine.test_server_sim import FAST_SIM, MODEL, get_json, metric, post, wait_idle
from tests.procs import ManagedProcess, free_port, start_engine

NUM_BLOCKS = 40
HOST_BLOCKS = 64


@pytest.fixture(scope="module")
def events_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, events_endpoint: str) -> Iterator[ManagedProcess]:
    process = start_engine(
        tmp_path_factory.mktemp("host-tier"),
        *FAST_SIM,
        "--num-blocks", str(NUM_BLOCKS),
        "--host-kv-blocks", str(HOST_BLOCKS),
        "--max-model-len", "512",
        "--kv-events", events_endpoint,
    )  # fmt: skip
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(engine: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)


def test_a_prefix_evicted_to_the_host_comes_back_as_cached_tokens(
    engine: ManagedProcess, client: openai.OpenAI, events_endpoint: str
) -> None:
    subscriber = zmq.Context.instance().socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.setsockopt(zmq.RCVTIMEO, 1000)
    subscriber.connect(events_endpoint)
    try:
        subscribed_by = time.monotonic() + 20
        while True:  # a SUB socket misses what is published before its subscription lands
            assert time.monotonic() < subscribed_by, "no AllBlocksCleared event after /reset_prefix_cache"
            assert post(f"{engine.url}/reset_prefix_cache", b"")[0] == 200
            try:
                if any(isinstance(e, AllBlocksCleared) for e in parse_frames(subscriber.recv_multipart())[1].events):
                    break
            except zmq.Again:
                continue
        document = list(range(3000, 3200))
        first = client.completions.create(model=MODEL, prompt=document, max_tokens=4)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        for offset in range(3):  # 3 x 13 blocks through a 40-block pool push the document out
            client.completions.create(
                model=MODEL, prompt=list(range(5000 + offset * 300, 5200 + offset * 300)), max_tokens=4
            )
        hits_before = metric(engine, "vllm:external_prefix_cache_hits_total")
        again = client.completions.create(model=MODEL, prompt=document, max_tokens=4)
        assert again.usage.prompt_tokens_details.cached_tokens == 192
        assert metric(engine, "vllm:external_prefix_cache_hits_total") - hits_before > 0
        stats = wait_idle(engine)
        assert stats["host_blocks"] == HOST_BLOCKS and stats["host_hit_blocks"] > 0
        assert 0 < stats["host_cached_blocks"] <= HOST_BLOCKS
        assert metric(engine, "kvgate:host_kv_cache_blocks") == HOST_BLOCKS
        on_host: set[int | bytes] = set()
        document_blocks = {wire_block_hash(block_hash) for block_hash in block_hashes(document, 16, MODEL)}
        deadline = time.monotonic() + 10
        while not on_host & document_blocks:
            assert time.monotonic() < deadline, "no BlockStored with medium CPU for the document"
            try:
                events = parse_frames(subscriber.recv_multipart())[1].events
            except zmq.Again:
                continue
            on_host.update(
                h for e in events if isinstance(e, BlockStored) and e.medium == MEDIUM_CPU for h in e.block_hashes
            )
    finally:
        subscriber.close()


def test_vanished_clients_and_sessions_leave_no_blocks_behind(engine: ManagedProcess, client: openai.OpenAI) -> None:
    """Streams cut mid-way and many session turns, while the pool spills to the host; the engine
    checks its invariants every step (--check-invariants) and ends with every block free."""
    body = json.dumps({"model": MODEL, "prompt": list(range(7000, 7300)), "max_tokens": 200, "stream": True})

    def cut_stream(_: int) -> None:
        request = urllib.request.Request(
            f"{engine.url}/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.readline()

    def session_turn(turn: int) -> int:
        prompt = list(range(8000, 8100 + 20 * turn))
        reply = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=8, extra_body={"kvgate_session": f"chat-{turn % 3}"}
        )
        return reply.usage.prompt_tokens_details.cached_tokens

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(cut_stream, range(4)))
        cached = list(pool.map(session_turn, range(9)))
    assert max(cached) > 0
    stats = wait_idle(engine)
    assert stats["kv_cache_usage"] == 0.0
    assert get_json(f"{engine.url}/health")["status"] == "ok"


def test_a_bad_session_key_is_a_400(engine: ManagedProcess) -> None:
    for session in ("", 42, "x" * 300):
        status, body = post(
            f"{engine.url}/v1/completions",
            json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1, "kvgate_session": session}).encode(),
        )
        assert status == 400 and body["error"]["param"] == "kvgate_session"
