"""Receive one replica's KV events over ZMQ SUB and hand them to its ``KVEventApplier``."""

import asyncio
import logging
import time

import zmq
import zmq.asyncio

from radix.kv_event_format import parse_frames
from radix.kv_event_ingest import KVEventApplier

log = logging.getLogger(__name__)


class KVEventSubscriber:
    """An asyncio task reading ``endpoint`` until stopped.

    A message that does not parse is logged and counted, never fatal. Sequence numbers reveal
    lost batches (counted; the index stays as good as the events that did arrive) and publisher
    restarts (the sequence goes back: the engine's cache started empty, so the replica's index
    is cleared).
    """

    def __init__(self, endpoint: str, applier: KVEventApplier, topic: str = "") -> None:
        self.endpoint = endpoint
        self.applier = applier
        self.topic = topic
        self.received = 0
        self.bad_messages = 0
        self.lost_batches = 0
        self.restarts = 0
        self.lag_s: float | None = None
        """Age of the latest batch on arrival (publisher's timestamp to now), clock skew included."""
        self._last_sequence: int | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Connect now (so no event published after this call is missed) and start reading."""
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        socket.connect(self.endpoint)
        self._task = asyncio.get_running_loop().create_task(self._read(socket), name=f"kv-events {self.endpoint}")

    def stop_soon(self) -> None:
        """Stop reading; the socket closes as the task ends."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def counters(self) -> dict[str, int]:
        return {
            "received": self.received,
            "bad_messages": self.bad_messages,
            "lost_batches": self.lost_batches,
            "restarts": self.restarts,
            **self.applier.counters.__dict__,
        }

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        try:
            while True:
                self._handle(await socket.recv_multipart())
        finally:
            socket.close()

    def _handle(self, parts: list[bytes]) -> None:
        try:
            sequence, batch = parse_frames(parts)
        except ValueError as exc:
            self.bad_messages += 1
            log.warning("%s: unreadable KV event message skipped: %s", self.applier.replica, exc)
            return
        self._check_sequence(sequence)
        self.received += 1
        self.lag_s = max(0.0, time.time() - batch.ts)
        try:
            self.applier.apply(batch)
        except (TypeError, ValueError, AttributeError) as exc:
            self.bad_messages += 1
            log.warning("%s: garbled KV event batch skipped: %r", self.applier.replica, exc)

    def _check_sequence(self, sequence: int) -> None:
        last = self._last_sequence
        self._last_sequence = sequence
        if last is None or sequence == last + 1:
            return
        if sequence <= last:
            self.restarts += 1
            log.info("%s: KV event publisher restarted; forgetting its cache", self.applier.replica)
            self.applier.clear()
        else:
            self.lost_batches += sequence - last - 1
            log.warning("%s: %d KV event batches lost", self.applier.replica, sequence - last - 1)
