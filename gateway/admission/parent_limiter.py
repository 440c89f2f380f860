"""Tenant caps of `kvgate gateway --workers N` counted once for all workers, by their parent.

Without ``shared_state``, each worker counting on its own would let N times every cap through.
So each worker asks the parent over a unix socket (gateway/admission/parent_wire.py,
gateway/process/workers/limit_server.py): one local round trip per take, tens of microseconds, and
frees and give-backs are sent without waiting. The parent frees a dead worker's slots when its
connection closes.

The parent unreachable (only while it is going down, or a call unanswered for ``timeout_s``):
one log line, and this worker counts on its own (``LocalLimiter``) until it reconnects, probing
on the same backoff as the Redis limiter. Slots taken from the parent before the connection
dropped were freed there with it, so their requests are no longer counted by the parent.
"""

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.admission.limiter import (
    Slot,
    TenantLimiter,
    Tokens,
    concurrency_exceeded,
    requests_exceeded,
    tokens_exceeded,
)
from gateway.admission.local_limiter import LocalLimiter
from gateway.admission.parent_wire import (
    CONCURRENCY,
    FREE_SLOT,
    GIVE_BACK,
    IN_FLIGHT,
    REQUESTS,
    TAKE_SLOT,
    TAKE_TOKENS,
    TOKENS,
    frame,
    read_frame,
)
from gateway.admission.redis_limiter import probe_delays
from gateway.admission.tenant_counters import TenantCounters

log = logging.getLogger("kvgate.workers")

CALL_TIMEOUT_S = 2.0
"""A call the parent has not answered by then counts as the parent gone (it answers in microseconds
unless the host is starved)."""


class ParentGone(Exception):
    """The call could not be answered: the connection to the parent is down."""


@dataclass
class ParentLease(Slot):
    """A slot counted by the parent: its number on this worker's connection."""

    number: int
    connection: int


@dataclass
class ParentTokens(Tokens):
    """Tokens taken from the parent's bucket for the tenant."""

    per_minute: int


class ParentLimiter(TenantLimiter):
    def __init__(self, path: Path, workers: int, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.path = path
        self.workers = workers
        self.timeout_s = timeout_s
        self.local = LocalLimiter()
        self.up = False
        self.connection = 0
        """Counts the connections made: a lease is freed on the connection that took it, or not at all."""
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._calls: dict[int, asyncio.Future[tuple[int, Any]]] = {}
        self._call_ids = itertools.count()
        self._lease_numbers = itertools.count()
        self._gone = asyncio.Event()

    async def start(self) -> None:
        if await self._connect():
            log.info("tenant limits counted by the parent for all %d workers (%s)", self.workers, self.path)
        else:
            log.warning("cannot reach the parent's limits at %s: this worker counts limits on its own", self.path)
            self._gone.set()
        self._keeper = asyncio.get_running_loop().create_task(self._keep_connected())

    async def stop(self) -> None:
        self.up = False
        for task in (self._keeper, self._reader_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._close()

    async def take_slot(self, tenant: TenantCounters) -> Slot:
        config = tenant.config
        if config is None or (config.max_concurrency is None and config.requests_per_minute is None):
            return self.local.take_slot_now(tenant)
        if not self.up:
            return self.local.take_slot_now(tenant)
        lease = ParentLease(tenant, next(self._lease_numbers), self.connection)
        limits = [config.max_concurrency or 0, config.requests_per_minute or 0]
        try:
            verdict, detail = await self._call(TAKE_SLOT, lease.number, tenant.name, *limits)
        except ParentGone:
            return self.local.take_slot_now(tenant)
        if verdict == CONCURRENCY:
            raise concurrency_exceeded(tenant.name, detail, config.max_concurrency or 0)
        if verdict == REQUESTS:
            raise requests_exceeded(tenant.name, config.requests_per_minute or 0, detail)
        tenant.usage.in_flight += 1
        return lease

    async def free_slot(self, slot: Slot) -> None:
        if not isinstance(slot, ParentLease):
            self.local.free_slot_now(slot)
            return
        slot.tenant.usage.in_flight -= 1
        if self.up and slot.connection == self.connection:
            self._send([FREE_SLOT, slot.number])

    async def take_tokens(self, tenant: TenantCounters, tokens: int) -> Tokens:
        per_minute = tenant.config.tokens_per_minute if tenant.config else None
        if per_minute is None:
            return Tokens(tenant, tokens)
        if not self.up:
            return self.local.take_tokens_now(tenant, tokens)
        try:
            verdict, wait_s = await self._call(TAKE_TOKENS, tenant.name, tokens, per_minute)
        except ParentGone:
            return self.local.take_tokens_now(tenant, tokens)
        if verdict == TOKENS:
            raise tokens_exceeded(tenant.name, per_minute, tokens, wait_s)
        return ParentTokens(tenant, tokens, per_minute)

    async def give_back(self, taken: Tokens, unused: int) -> None:
        if not isinstance(taken, ParentTokens):
            self.local.give_back_now(taken, unused)
        elif self.up:
            self._send([GIVE_BACK, taken.tenant.name, unused, taken.per_minute])

    async def shared_status(self, tenants: Sequence[TenantCounters]) -> dict[str, object] | None:
        names = [tenant.name for tenant in tenants if tenant.limited]
        counts: dict[str, int] | None = None
        if self.up:
            with contextlib.suppress(ParentGone):
                counts = (await self._call(IN_FLIGHT, names))[1]
        return {"parent": str(self.path), "workers": self.workers, "up": self.up, "tenants_in_flight": counts}

    def metrics(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "kvgate_worker_limits_up",
            "1 while the parent counts tenant limits for all workers, 0 while this worker counts on its own.",
            1 if self.up else 0,
        )

    async def _call(self, kind: int, *args: Any) -> tuple[int, Any]:
        """Send a message that gets an answer; (verdict, detail), or raise ParentGone."""
        call = next(self._call_ids)
        future: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        self._calls[call] = future
        try:
            self._send([kind, call, *args])
            async with asyncio.timeout(self.timeout_s):
                return await future
        except TimeoutError:
            self._lost(f"no answer within {self.timeout_s}s")
            raise ParentGone from None
        finally:
            self._calls.pop(call, None)

    def _send(self, message: list[Any]) -> None:
        if self._writer is not None:
            self._writer.write(frame(message))

    async def _connect(self) -> bool:
        try:
            reader, self._writer = await asyncio.open_unix_connection(str(self.path))
        except OSError:
            return False
        self.connection += 1
        self.up = True
        self._gone.clear()
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader, self.connection))
        return True

    async def _read(self, reader: asyncio.StreamReader, connection: int) -> None:
        try:
            while True:
                call, verdict, detail = await read_frame(reader)
                future = self._calls.get(call)
                if future is not None and not future.done():
                    future.set_result((verdict, detail))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            if connection == self.connection:
                self._lost(f"{type(exc).__name__}: {exc}")

    def _lost(self, reason: str) -> None:
        """The connection is down: fail the calls waiting on it, count on our own, reconnect."""
        if not self.up:
            return
        self.up = False
        log.warning("lost the parent's limits (%s): this worker counts limits on its own until it is back", reason)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(ParentGone())
        self._close()
        self._gone.set()

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def _keep_connected(self) -> None:
        while True:
            await self._gone.wait()
            for delay in probe_delays():
                await asyncio.sleep(delay)
                if await self._connect():
                    log.warning("the parent's limits answer again: limits are counted for all workers")
                    break
