"""Publishes the block manager's KV events over ZMQ PUB in vLLM's wire format, with vLLM's replay.

What goes on the wire is what vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``)
sends, so that vLLM's consumers (Dynamo's KV router, llm-d's indexer) read it: sequence numbers
from 0, block hashes as 64-bit unsigned ints (the last 8 bytes of our 128-bit hash, as vLLM cuts
its sha256 ones: ``radix.kv_event_format.wire_block_hash``), the data-parallel rank 0. The block
manager's own events keep the full hash; the conversion happens here, at the edge.

Replay (optional ``replay_endpoint``) has the shape of vLLM's ``ZmqEventPublisher``: a ROUTER
socket takes a start sequence number (8 bytes, big-endian) from a DEALER or REQ client and
answers with every buffered batch from there on, one message ``[sequence, payload]`` each, then
``[END_SEQ, b""]``. kvgate's engine goes one step further: when the buffer no longer reaches back
to the start asked for, it answers with a snapshot instead, one batch ``[AllBlocksCleared,
BlockStored...]`` of every block cached now, under the sequence number of the last batch
published before it. A gateway that starts late thus learns the replica's whole cache.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import zmq

from radix.kv_event_format import EventBatch, KVEvent, encode_batch, frames, to_wire

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "kv-events"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""Sequence frame of the message that ends a replay (vLLM's marker)."""
DEFAULT_BUFFER_STEPS = 10_000
"""Batches kept for replay (vLLM's default)."""
DATA_PARALLEL_RANK = 0
"""vLLM stamps each batch with its publisher's rank; one engine is one rank."""
SNAPSHOT_TIMEOUT_S = 30.0

Snapshot = tuple[int, list[KVEvent]]
"""The sequence number of the last batch published and the events that rebuild the cache as of it."""
SnapshotSource = Callable[[], Future[Snapshot]]
"""Asks the engine thread for a snapshot; the future resolves once it has taken one."""


class KVEventPublisher:
    """Binds a PUB socket at ``endpoint``; ``publish`` sends one batch per engine step.

    The PUB socket is used from the engine thread only (ZMQ sockets are not thread-safe); the
    replay socket has its own thread, which shares only the buffer (under a lock) with it.
    """

    def __init__(
        self,
        endpoint: str,
        topic: str = DEFAULT_TOPIC,
        replay_endpoint: str | None = None,
        buffer_steps: int = DEFAULT_BUFFER_STEPS,
    ) -> None:
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self.topic = topic
        self._sequence = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._snapshot_source: SnapshotSource | None = None
        self._replay: _ReplayServer | None = None
        if replay_endpoint is not None:
            self._replay = _ReplayServer(self._context, replay_endpoint, self)

    @property
    def last_sequence(self) -> int:
        """Sequence number of the latest batch published, -1 before the first."""
        return self._sequence - 1

    def serve_snapshots(self, source: SnapshotSource) -> None:
        """Answer replays that reach back past the buffer with a snapshot from ``source``."""
        self._snapshot_source = source

    def start(self) -> None:
        if self._replay is not None:
            self._replay.start()

    def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        batch = frames(self.topic, self._sequence, _wire_batch(events))
        self._socket.send_multipart(batch)
        with self._lock:
            if self._replay is not None:
                self._buffer.append((self._sequence, batch[-1]))
            self._sequence += 1

    def close(self) -> None:
        if self._replay is not None:
            self._replay.stop()
        self._socket.close()

    def replay_from(self, start: int) -> list[tuple[int, bytes]] | None:
        """Buffered batches from ``start`` on, or None when the buffer no longer reaches back to it."""
        with self._lock:
            oldest = self._buffer[0][0] if self._buffer else self._sequence
            if start < oldest and self._snapshot_source is not None:
                return None
            return [(sequence, payload) for sequence, payload in self._buffer if sequence >= start]

    def snapshot(self) -> tuple[int, bytes]:
        assert self._snapshot_source is not None
        sequence, events = self._snapshot_source().result(SNAPSHOT_TIMEOUT_S)
        return sequence, encode_batch(_wire_batch(events))


def _wire_batch(events: list[KVEvent]) -> EventBatch:
    return EventBatch(time.time(), [to_wire(event) for event in events], DATA_PARALLEL_RANK)


class _ReplayServer:
    """The ROUTER socket and the thread that answers it."""

    def __init__(self, context: "zmq.Context[zmq.Socket[bytes]]", endpoint: str, publisher: KVEventPublisher) -> None:
        self._socket = context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 0)  # a ROUTER drops what exceeds it; a whole-buffer replay must not
        self._socket.bind(endpoint)
        self._publisher = publisher
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kv-events-replay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        self._socket.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            if not self._socket.poll(100):
                continue
            request = self._socket.recv_multipart()
            if len(request) != 3 or len(request[2]) != 8:
                log.warning("KV event replay: malformed request of %d frames ignored", len(request))
                continue
            client, delimiter, start = request
            try:
                self._answer(client, delimiter, int.from_bytes(start, "big"))
            except (TimeoutError, zmq.ZMQError) as exc:
                log.warning("KV event replay from %d failed: %r", int.from_bytes(start, "big"), exc)

    def _answer(self, client: bytes, delimiter: bytes, start: int) -> None:
        batches = self._publisher.replay_from(start)
        if batches is None:
            batches = [self._publisher.snapshot()]
            log.info("KV event replay from %d: buffer starts later; sent a snapshot", start)
        for sequence, payload in batches:
            self._socket.send_multipart([client, delimiter, sequence.to_bytes(8, "big"), payload])
        self._socket.send_multipart([client, delimiter, END_SEQ, b""])
