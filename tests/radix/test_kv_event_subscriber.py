"""Real ZMQ PUB -> SUB over loopback into the prefix index, in both event encodings."""

import asyncio
import struct
import time
from collections.abc import Callable, Iterator

import msgspec
import pytest
import zmq
import zmq.asyncio

from radix.hashing import block_hashes, hash_to_bytes
from radix.kv_event_format import BlockRemoved, BlockStored, EventBatch, encode_batch, frames
from radix.kv_event_ingest import KVEventApplier
from radix.kv_event_subscriber import END_SEQ, KVEventSubscriber
from radix.prefix_index import PrefixIndex
from tests.procs import free_port

BLOCK = 16
MODEL = "smollm2-135m"
PROMPT = list(range(1000, 1100))


@pytest.fixture
def publisher() -> Iterator[tuple[zmq.Socket, str]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    socket = zmq.Context.instance().socket(zmq.PUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(endpoint)
    yield socket, endpoint
    socket.close()


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def subscribed(endpoint: str, socket: zmq.Socket) -> tuple[PrefixIndex, KVEventSubscriber, int]:
    """A running subscriber past ZMQ's slow-joiner window (probes are sent until one lands),
    and the sequence number the publisher sends next."""
    index = PrefixIndex()
    index.add_replica("r")
    subscriber = KVEventSubscriber(endpoint, KVEventApplier(index, "r", MODEL, BLOCK))
    subscriber.start()
    probe = EventBatch(0.0, [BlockRemoved([b"probe"])])
    sequence = 0
    while subscriber.received == 0:
        socket.send_multipart(frames("kv-events", sequence, probe))
        sequence += 1
        await asyncio.sleep(0.02)
    # probes still in flight would arrive after the test's own batches and read as a publisher restart
    await until(lambda: subscriber._last_sequence == sequence - 1)
    return index, subscriber, sequence


async def test_bundled_engine_frames_update_the_index(publisher: tuple[zmq.Socket, str]) -> None:
    socket, endpoint = publisher
    index, subscriber, sequence = await subscribed(endpoint, socket)
    hashes = block_hashes(PROMPT, BLOCK, MODEL)
    stored = BlockStored([hash_to_bytes(h) for h in hashes], None, PROMPT[: len(hashes) * BLOCK], BLOCK)
    sent_at = time.time()
    socket.send_multipart(frames("kv-events", sequence, EventBatch(sent_at, [stored])))
    await until(lambda: index.match(hashes) == {"r": 6})
    assert subscriber.lost_batches == 0
    assert subscriber.lag_s is not None and 0 <= subscriber.lag_s <= time.time() - sent_at
    removed = EventBatch(time.time(), [BlockRemoved([hash_to_bytes(hashes[2])])])
    socket.send_multipart(frames("kv-events", sequence + 10, removed))
    await until(lambda: index.match(hashes) == {"r": 2})
    assert subscriber.lost_batches == 9
    await subscriber.stop()


async def test_vllm_positional_events_with_int_hashes(publisher: tuple[zmq.Socket, str]) -> None:
    """Older vLLM: events as arrays, 64-bit int hashes, 32-token blocks (two of ours)."""
    socket, endpoint = publisher
    index, subscriber, sequence = await subscribed(endpoint, socket)
    stored = ["BlockStored", [2**63 + 5, 2**63 + 6], None, PROMPT[:64], 32, None, "GPU"]
    payload = msgspec.msgpack.encode([time.time(), [stored], 0])
    socket.send_multipart([b"kv-events", struct.pack(">Q", sequence), payload])
    hashes = block_hashes(PROMPT, BLOCK, MODEL)
    await until(lambda: index.match(hashes) == {"r": 4})
    await subscriber.stop()


async def test_garbage_is_counted_and_a_restart_clears_the_replica(publisher: tuple[zmq.Socket, str]) -> None:
    socket, endpoint = publisher
    index, subscriber, next_sequence = await subscribed(endpoint, socket)
    socket.send_multipart([b"kv-events", b"short", b"\xc1"])
    socket.send_multipart([b"kv-events", struct.pack(">Q", next_sequence), b"\xc1not msgpack"])
    hashes = block_hashes(PROMPT, BLOCK, MODEL)
    stored = BlockStored([hash_to_bytes(h) for h in hashes], None, PROMPT[:96], BLOCK)
    socket.send_multipart(frames("kv-events", next_sequence + 1, EventBatch(0.0, [stored])))
    await until(lambda: index.blocks("r") == 6)
    assert subscriber.bad_messages == 2
    socket.send_multipart(frames("kv-events", 0, EventBatch(0.0, [])))
    await until(lambda: subscriber.restarts == 1)
    assert index.blocks("r") == 0
    await subscriber.stop()


async def test_a_sequence_gap_is_replayed_from_the_replay_socket(publisher: tuple[zmq.Socket, str]) -> None:
    """vLLM's replay shape: DEALER sends the start sequence; ROUTER answers batches, then END_SEQ."""
    socket, endpoint = publisher
    replay_endpoint = f"tcp://127.0.0.1:{free_port()}"
    router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(replay_endpoint)
    prompts = {seq: [seq * 1000 + i for i in range(32)] for seq in (1, 2, 3)}

    def batch(seq: int) -> EventBatch:
        hashes = block_hashes(prompts[seq], BLOCK, MODEL)
        return EventBatch(time.time(), [BlockStored([hash_to_bytes(h) for h in hashes], None, prompts[seq], BLOCK)])

    buffered: dict[int, EventBatch] = {}

    async def serve() -> None:
        while True:
            client, delimiter, start = await router.recv_multipart()
            for seq in sorted(s for s in buffered if s >= int.from_bytes(start, "big")):
                await router.send_multipart([client, delimiter, seq.to_bytes(8, "big"), encode_batch(buffered[seq])])
            await router.send_multipart([client, delimiter, END_SEQ, b""])

    server = asyncio.get_running_loop().create_task(serve())
    index = PrefixIndex()
    index.add_replica("r")
    subscriber = KVEventSubscriber(endpoint, KVEventApplier(index, "r", MODEL, BLOCK), replay_endpoint=replay_endpoint)
    subscriber.start()
    try:
        first = EventBatch(time.time(), [BlockRemoved([b"probe"])])
        while subscriber.received == 0:
            socket.send_multipart(frames("kv-events", 0, first))
            await asyncio.sleep(0.02)
        buffered.update({seq: batch(seq) for seq in (1, 2)})
        socket.send_multipart(frames("kv-events", 3, batch(3)))
        await until(lambda: all(index.match(block_hashes(prompts[seq], BLOCK, MODEL)) for seq in (1, 2, 3)))
        assert subscriber.lost_batches == 0 and subscriber.replay_failures == 0
        assert subscriber.replayed_batches == 2 and subscriber.restarts == 0
    finally:
        await subscriber.stop()
        server.cancel()
        router.close()


async def test_a_backlog_of_batches_gives_the_loop_back_between_batches(publisher: tuple[zmq.Socket, str]) -> None:
    """Batches queued while the loop was busy are applied one loop turn each, not drained in one
    turn (a queued message's recv is a finished future, and awaiting it does not yield)."""
    socket, endpoint = publisher
    _, subscriber, sequence = await subscribed(endpoint, socket)
    backlog = 300
    for offset in range(backlog):
        socket.send_multipart(frames("kv-events", sequence + offset, EventBatch(time.time(), [])))
    time.sleep(0.3)  # the loop is busy: every batch is queued in the socket by now
    received_before, most_in_one_turn = subscriber.received, 0

    async def watch_turns() -> None:
        nonlocal most_in_one_turn
        last = subscriber.received
        while True:
            await asyncio.sleep(0)
            most_in_one_turn = max(most_in_one_turn, subscriber.received - last)
            last = subscriber.received

    watcher = asyncio.get_running_loop().create_task(watch_turns())
    await until(lambda: subscriber.received == received_before + backlog)
    watcher.cancel()
    assert most_in_one_turn <= 2, f"{most_in_one_turn} of {backlog} queued batches were applied in one loop turn"
    await subscriber.stop()
