"""The parent's side of shared tenant limits: one unix socket, one connection per worker.

Each call is a few dictionary operations on the parent's event loop, which has nothing else to
do but watch its workers, so an admission costs a worker one local round trip (tens of
microseconds) rather than a network hop. A worker that dies closes its connection, and its
leases are freed at once: no expiry to wait for, as with Redis.
"""

import asyncio
import contextlib
import itertools
import logging
from pathlib import Path
from typing import Any

from gateway.admission.parent_wire import FREE_SLOT, GIVE_BACK, IN_FLIGHT, OK, TAKE_SLOT, TAKE_TOKENS, frame, read_frame
from gateway.process.workers.shared_counts import SharedCounts

log = logging.getLogger("kvgate.workers")


class LimitServer:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts = SharedCounts()
        self._connections = itertools.count()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            self._server = None
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = next(self._connections)
        self._writers.add(writer)
        try:
            while True:
                reply = self.handle(connection, await read_frame(reader))
                if reply is not None:
                    writer.write(frame(reply))
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except (ValueError, TypeError, IndexError) as exc:
            log.error("worker limits connection %d sent a bad message (%s); closing it", connection, exc)
        finally:
            self._writers.discard(writer)
            freed = self.counts.drop(connection)
            if freed:
                log.warning("a worker's limits connection closed holding %d slots; freed them", freed)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def handle(self, connection: int, message: list[Any]) -> list[Any] | None:
        """The answer to one message (None for those that get none)."""
        kind = message[0]
        if kind == TAKE_SLOT:
            _, call, lease, tenant, max_concurrency, per_minute = message
            return [call, *self.counts.take_slot(connection, lease, tenant, max_concurrency, per_minute)]
        if kind == FREE_SLOT:
            self.counts.free_slot(connection, message[1])
            return None
        if kind == TAKE_TOKENS:
            _, call, tenant, tokens, per_minute = message
            return [call, *self.counts.take_tokens(tenant, tokens, per_minute)]
        if kind == GIVE_BACK:
            _, tenant, tokens, per_minute = message
            self.counts.give_back(tenant, tokens, per_minute)
            return None
        if kind == IN_FLIGHT:
            _, call, tenants = message
            return [call, OK, {tenant: self.counts.in_flight.get(tenant, 0) for tenant in tenants}]
        raise ValueError(f"unknown message kind {kind!r}")
