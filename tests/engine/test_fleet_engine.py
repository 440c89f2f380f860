"""The engine's side of a fleet of gateways, on a real simulated engine: the first streamed chat
chunk carries the first token, the load socket reports queued work and running decodes, and the replay socket
answers with buffered batches or, once its buffer is outrun, a snapshot of the whole cache."""

import asyncio
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import orjson
import pytest
import zmq

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.model.runner_api import SamplingParams
from gateway.backends.pool import BackendPool
from gateway.config import BackendSpec, HealthConfig
from protocol.replica_stats import DecodeProgress, ReplicaLoad, decode_load, decode_stats
from radix.hashing import block_hashes, hash_to_bytes
from radix.kv_event_format import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockStored,
    EventBatch,
    parse_frames,
    wire_block_hash,
)
from tests.procs import ManagedProcess, free_port, start_engine

MODEL = "smollm2-135m"
SLOW_PREFILL = (
    "--sim",
    "--sim-preset",
    "instant",
    "--sim-prefill-per-token-s",
    "0.001",
    "--sim-decode-base-s",
    "0.002",
)
"""A 600-token prompt takes about 0.6 s of prefill; decode is quick."""
END_SEQ = (-1).to_bytes(8, "big", signed=True)


@pytest.fixture(scope="module")
def endpoints() -> dict[str, str]:
    return {name: f"tcp://127.0.0.1:{free_port()}" for name in ("events", "replay", "load")}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, endpoints: dict[str, str]) -> Iterator[ManagedProcess]:
    process = start_engine(
        tmp_path_factory.mktemp("fleet-engine"),
        *SLOW_PREFILL,
        "--num-blocks", "400",
        "--max-model-len", "4096",
        "--kv-events", endpoints["events"],
        "--kv-events-replay", endpoints["replay"],
        "--kv-events-buffer-steps", "3",
        "--load-events", endpoints["load"],
    )  # fmt: skip
    yield process
    process.stop()


def prompt(seed: int, length: int = 600) -> list[int]:
    return [(seed * 7919 + i * 37) % 40000 + 100 for i in range(length)]


async def first_chat_event(url: str, content: str) -> tuple[dict, float, float]:
    """The first SSE event of a streamed chat, when it came (seconds after sending) and when the last did."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 3, "stream": True}
    started = time.monotonic()
    first: dict | None = None
    first_at = 0.0
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/chat/completions", json=body) as reply:
        async for line in reply.content:
            if line.startswith(b"data: {") and first is None:
                first, first_at = orjson.loads(line[6:]), time.monotonic() - started
    assert first is not None
    return first, first_at, time.monotonic() - started


def test_first_chat_chunk_carries_role_and_first_token(engine: ManagedProcess) -> None:
    """Today's bug: the role chunk (empty content) left at once, before a long prefill."""
    long_question = " ".join(f"word{i}" for i in range(500))
    first, _, _ = asyncio.run(first_chat_event(engine.url, long_question))
    delta = first["choices"][0]["delta"]
    assert delta["role"] == "assistant"
    assert delta["content"], f"the first chunk carries no token: {first}"


def test_stats_are_the_typed_struct(engine: ManagedProcess) -> None:
    stats = decode_stats(get_bytes(f"{engine.url}/stats"))
    assert stats.num_blocks == 400 and stats.block_size == 16 and stats.max_num_seqs == 64
    assert stats.running == 0 and stats.queued_prefill_tokens == 0


@pytest.fixture
def load_socket(endpoints: dict[str, str]) -> Iterator[zmq.Socket]:
    """A subscriber to the engine's load socket, closed after the test."""
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoints["load"])
    yield socket
    socket.close()


def test_load_socket_reports_queued_prefill_ten_times_a_second(engine: ManagedProcess, load_socket: zmq.Socket) -> None:
    """While the engine works, load messages keep the pace they have when it is idle (every 0.05 s on a
    quiet machine): measured against the idle pace first, so that a busy machine slows both alike."""
    loads = [decode_load(load_socket.recv()) for _ in range(11)]
    assert all(load.running == 0 and load.queued_prefill_tokens == 0 for load in loads)
    idle_gap = median_gap([load.ts for load in loads])
    with ThreadPoolExecutor(4) as pool:
        sent = [pool.submit(complete, engine.url, prompt(100 + index)) for index in range(4)]
        wait_for_load(
            load_socket, lambda load: (load.queued_prefill_tokens or 0) > 600 and load.running + load.waiting > 1
        )
        busy_gap = median_gap([decode_load(load_socket.recv()).ts for _ in range(11)])
        assert busy_gap < 2 * idle_gap, f"busy, a load message every {busy_gap} s; idle, every {idle_gap} s"
        for future in sent:
            future.result()
    idle = wait_for_load(load_socket, lambda load: load.running == 0 and load.waiting == 0)
    assert idle.queued_prefill_tokens == 0 and idle.prefill_tokens_per_s


def test_load_socket_reports_prompts_held_behind_a_prefix_being_computed(
    engine: ManagedProcess, load_socket: zmq.Socket
) -> None:
    """Two follow-ups sent while their first turn is prefilling (two 2,048-token chunks) wait for its
    blocks: the load message names the block they wait for (one of the first turn's) and their
    whole prompts."""
    first_turn = prompt(50, 3500)
    follow_ups = [[*first_turn, *prompt(51 + index, 20)] for index in range(2)]
    wait_for_load(load_socket, lambda load: load.running == 0 and load.waiting == 0)
    with ThreadPoolExecutor(3) as pool:
        sent = [pool.submit(complete, engine.url, first_turn)]
        wait_for_load(load_socket, lambda load: load.running == 1 and (load.queued_prefill_tokens or 0) > 1000)
        sent += [pool.submit(complete, engine.url, follow_up) for follow_up in follow_ups]
        held = wait_for_load(load_socket, lambda load: any(wait.requests == 2 for wait in load.prefix_waits))
        for future in sent:
            future.result()
    (wait,) = held.prefix_waits
    assert wait.tokens == 2 * 3520
    assert wait.block_hash in {hash_to_bytes(h) for h in block_hashes(first_turn, 16, MODEL)}
    backend = BackendPool.from_specs([(BackendSpec(name="e", url=engine.url), MODEL)], HealthConfig()).backends["e"]
    backend.load.on_report(held)
    assert backend.state().prefix_waits == {int.from_bytes(wait.block_hash, "big"): (2 * 3520, 2)}, (
        "what routing reads, by the gateway's hash"
    )
    assert not wait_for_load(load_socket, lambda load: load.running == 0).prefix_waits


def test_load_socket_and_stats_report_each_running_decodes_progress(
    engine: ManagedProcess, load_socket: zmq.Socket
) -> None:
    """A 400-token completion of a 600-token prompt: while its prompt is prefilled (0.6 s), no tokens
    and 400 to come; mid-decode, its tokens so far, their decode time and the tokens it may still
    make, on the load socket and at /stats; the gateway's routing reads them; gone once it ends."""
    wait_for_load(load_socket, lambda load: load.running == 0 and load.waiting == 0)
    body = {"model": MODEL, "prompt": prompt(70), "max_tokens": 400, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        sent = pool.submit(post_json, f"{engine.url}/v1/completions", body)
        prefilling = wait_for_load(load_socket, lambda load: load.running == 1)
        assert prefilling.decodes == [DecodeProgress(0, 0.0, 400)]
        mid = wait_for_load(load_socket, lambda load: bool(load.decodes) and load.decodes[0].tokens >= 20)
        (decode,) = mid.decodes or []
        assert decode.tokens + decode.tokens_left == 400
        assert 0 < decode.decode_s < time.monotonic() - started
        stats = decode_stats(get_bytes(f"{engine.url}/stats"))
        assert stats.decodes and stats.decodes[0].tokens >= decode.tokens
        assert sent.result()["usage"]["completion_tokens"] == 400
    backend = BackendPool.from_specs([(BackendSpec(name="e", url=engine.url), MODEL)], HealthConfig()).backends["e"]
    backend.load.on_report(mid)
    assert backend.state().decodes == (decode,), "what the P/D decider reads"
    assert wait_for_load(load_socket, lambda load: load.running == 0).decodes == []


def test_replay_sends_buffered_batches_then_a_snapshot_once_outrun(
    engine: ManagedProcess, endpoints: dict[str, str]
) -> None:
    complete(engine.url, prompt(1, 100))
    batches = replay(endpoints["replay"], 0)
    first_sequence = batches[0][0]
    if first_sequence == 0:
        assert [sequence for sequence, _ in batches] == list(range(len(batches)))
    for seed in range(2, 7):
        complete(engine.url, prompt(seed, 100))
    (sequence, snapshot), *rest = replay(endpoints["replay"], 0)
    assert not rest, "a snapshot is one batch"
    assert isinstance(snapshot.events[0], AllBlocksCleared)
    stored = snapshot.events[1:]
    assert all(isinstance(event, BlockStored) and len(event.block_hashes) == 1 for event in stored)
    held = {event.block_hashes[0] for event in stored if isinstance(event, BlockStored)}
    assert len(held) == decode_stats(get_bytes(f"{engine.url}/stats")).cached_blocks
    for seed in range(1, 7):
        expected = {wire_block_hash(h) for h in block_hashes(prompt(seed, 100), 16, MODEL)}
        assert expected <= held, f"prompt {seed}'s blocks are missing from the snapshot"
    recent = replay(endpoints["replay"], sequence)
    assert recent and recent[0][0] >= sequence - 2, "the buffer still covers the latest batches"


def complete(url: str, token_ids: list[int]) -> None:
    answer = post_json(f"{url}/v1/completions", {"model": MODEL, "prompt": token_ids, "max_tokens": 2})
    assert answer["usage"]["completion_tokens"] == 2


def wait_for_load(socket: zmq.Socket, condition: Callable[[ReplicaLoad], bool], timeout: float = 20.0) -> ReplicaLoad:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = decode_load(socket.recv())
        if condition(load):
            return load
    raise AssertionError("load condition not reached")


def median_gap(stamps: list[float]) -> float:
    """The median time between consecutive load messages (their own send times)."""
    ordered = sorted(stamps)
    return statistics.median(later - earlier for earlier, later in zip(ordered, ordered[1:], strict=False))


def replay(endpoint: str, start: int) -> list[tuple[int, EventBatch]]:
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 10_000)
    socket.connect(endpoint)
    try:
        socket.send_multipart([b"", start.to_bytes(8, "big")])
        batches = []
        while True:
            parts = socket.recv_multipart()
            if parts[-2] == END_SEQ:
                return batches
            batches.append(parse_frames(parts))
    finally:
        socket.close()


def get_bytes(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return orjson.loads(response.read())


def test_snapshot_holds_every_cached_block_on_both_tiers_least_recent_first() -> None:
    manager = BlockManager(num_blocks=4, block_size=4, model_name=MODEL, host_blocks=8)
    first = computed(manager, 0, list(range(100, 112)))
    manager.free(first)
    second = computed(manager, 1, list(range(200, 212)))
    stored = manager.snapshot()
    on_host = [event for event in stored if event.medium == MEDIUM_CPU]
    on_device = [event for event in stored if event.medium == MEDIUM_GPU]
    assert len(on_host) == 2 and len(on_device) == 4, "the first prompt's tail went to the host tier"
    assert stored[: len(on_host)] == on_host, "host blocks are older than device blocks"
    device_hashes = [event.block_hashes[0] for event in on_device]
    expected = [hash_to_bytes(h) for h in block_hashes(second.token_ids, 4, MODEL)]
    assert device_hashes[-3:] == expected[::-1], "blocks in use come last, deepest first"
    assert all(
        event.parent_block_hash == expected[index - 1] for index, event in zip((2, 1), on_device[1:3], strict=True)
    )
    manager.assert_invariants()


def computed(manager: BlockManager, seq_id: int, token_ids: list[int]) -> Sequence:
    seq = Sequence(seq_id, token_ids, SamplingParams(max_tokens=1), 64)
    assert manager.allocate(seq)
    manager.take_transfers()
    seq.num_computed_tokens = len(token_ids)
    manager.register_computed_blocks(seq)
    return seq
