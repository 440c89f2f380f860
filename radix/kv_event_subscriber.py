"""Receive one replica's KV events over ZMQ SUB and hand them to its ``KVEventApplier``.

With a replay endpoint (vLLM's ROUTER replay socket, or the bundled engine's), the subscriber
never settles for a partial view: on start it asks for everything from sequence 0 (the bundled
engine answers with a snapshot of its cache once its buffer no longer reaches back that far), and
on a sequence gap it asks for the missing batches.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, replace

import zmq
import zmq.asyncio

from radix.kv_event_format import EventBatch, parse_frames
from radix.kv_event_ingest import IngestCounters, KVEventApplier

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""Sequence frame that ends a replay (vLLM's marker)."""
REPLAY_TIMEOUT_S = 5.0
"""Longest wait for the next message of a replay (a snapshot of a large cache takes a moment)."""
REPLAY_RETRY_S = 5.0
"""After a failed replay, the next one is tried with the first batch at least this much later."""


@dataclass(frozen=True)
class SubscriberStats:
    """One replica's KV-event stream as the gateway received it."""

    received: int
    bad_messages: int
    lost_batches: int
    """Batches missed (sequence gaps)."""
    restarts: int
    replays: int
    replayed_batches: int
    replay_failures: int
    lag_s: float | None
    """Age of the latest batch on arrival; None before the first."""
    ingest: IngestCounters


class KVEventSubscriber:
    """An asyncio task reading ``endpoint`` until stopped.

    A message that does not parse is logged and counted, never fatal. Sequence numbers reveal
    lost batches (replayed when a replay endpoint is known, else counted: the index stays as good
    as the events that did arrive) and publisher restarts (the sequence goes back with a newer
    timestamp: the engine's cache started empty, so the replica's index is cleared). With replay, a
    batch whose sequence and timestamp are both not newer than the last applied one was already
    applied through a replay and is skipped.
    """

    def __init__(
        self,
        endpoint: str,
        applier: KVEventApplier,
        topic: str = "",
        replay_endpoint: str | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self.applier = applier
        self.topic = topic
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.received = 0
        self.bad_messages = 0
        self.lost_batches = 0
        self.restarts = 0
        self.replays = 0
        self.replayed_batches = 0
        self.replay_failures = 0
        self.lag_s: float | None = None
        """Age of the latest batch on arrival (publisher's timestamp to now), clock skew included."""
        self._last_sequence: int | None = None
        self._last_ts = 0.0
        self._retry_from: int | None = None
        """Set while the view is incomplete after a failed replay: where that replay started."""
        self._retry_replay_at = 0.0
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

    @property
    def synced(self) -> bool:
        """Whether the view is whole: some batch applied and no failed replay outstanding."""
        return self._last_sequence is not None and self._retry_from is None

    def stats(self) -> SubscriberStats:
        return SubscriberStats(
            received=self.received,
            bad_messages=self.bad_messages,
            lost_batches=self.lost_batches,
            restarts=self.restarts,
            replays=self.replays,
            replayed_batches=self.replayed_batches,
            replay_failures=self.replay_failures,
            lag_s=self.lag_s,
            ingest=replace(self.applier.counters),
        )

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        try:
            if self.replay_endpoint is not None:
                await self._replay(0)
            while True:
                await self._handle(await socket.recv_multipart())
                # A message already queued makes recv a finished future, and awaiting one does not
                # give the loop back: a backlog would be drained in one loop iteration.
                await asyncio.sleep(0)
        finally:
            socket.close()

    async def _handle(self, parts: list[bytes]) -> None:
        try:
            sequence, batch = parse_frames(parts)
        except ValueError as exc:
            self.bad_messages += 1
            log.warning("%s: unreadable KV event message skipped: %s", self.applier.replica, exc)
            return
        self.received += 1
        self.lag_s = max(0.0, time.time() - batch.ts)
        if not await self._in_order(sequence, batch):
            return
        self._apply(sequence, batch)

    async def _in_order(self, sequence: int, batch: EventBatch) -> bool:
        """Whether ``batch`` is the next one to apply, after replaying what came before it if needed."""
        last = self._last_sequence
        if last is not None and sequence <= last:
            if self.replay_endpoint is not None and batch.ts <= self._last_ts:
                return False
            self.restarts += 1
            log.info("%s: KV event publisher restarted; forgetting its cache", self.applier.replica)
            self.applier.clear()
            self._last_sequence = last = None
        expected = 0 if last is None else last + 1
        if self.replay_endpoint is not None:
            if self._retry_from is not None:
                if time.monotonic() >= self._retry_replay_at:
                    await self._replay(self._retry_from)
            elif sequence > expected:
                await self._replay(expected)
            last = self._last_sequence
            if last is not None and sequence <= last:
                return False
            expected = 0 if last is None else last + 1
        if sequence > expected and last is not None:
            self.lost_batches += sequence - expected
            log.warning("%s: %d KV event batches lost", self.applier.replica, sequence - expected)
        return True

    async def _replay(self, start: int) -> None:
        """Apply the batches the publisher still has from ``start`` on (or its snapshot)."""
        assert self.replay_endpoint is not None
        self.replays += 1
        socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.replay_endpoint)
        try:
            await socket.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                parts = await asyncio.wait_for(socket.recv_multipart(), self.replay_timeout_s)
                if len(parts) >= 2 and parts[-2] == END_SEQ:
                    break
                sequence, batch = parse_frames(parts)
                self.replayed_batches += 1
                self._apply(sequence, batch)
            self._retry_from = None
        except (TimeoutError, ValueError, zmq.ZMQError) as exc:
            self.replay_failures += 1
            self._retry_from = start if self._retry_from is None else min(start, self._retry_from)
            self._retry_replay_at = time.monotonic() + REPLAY_RETRY_S
            log.warning("%s: KV event replay from %d failed: %r", self.applier.replica, start, exc)
        finally:
            socket.close()

    def _apply(self, sequence: int, batch: EventBatch) -> None:
        self._last_sequence = sequence
        self._last_ts = max(self._last_ts, batch.ts)
        try:
            self.applier.apply(batch)
        except (TypeError, ValueError, AttributeError) as exc:
            self.bad_messages += 1
            log.warning("%s: garbled KV event batch skipped: %r", self.applier.replica, exc)
