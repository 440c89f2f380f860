"""The Redis limiter's connection: a client with short timeouts, its Lua scripts, and bounded calls.

Every call runs as a task of its own that nobody cancels: the caller stops waiting after
``2 x timeout_s`` (and raises TimeoutError), while the call itself ends on the client's socket
timeouts. So neither a slow Redis nor a request cancelled mid-call (its client went away) ever
interrupts redis-py halfway through a command, and nothing waits on Redis for longer than that.

The connection pool is a blocking one of ``CONNECTIONS``: a burst of more concurrent calls waits
for a free connection (within the same bound) instead of failing with "Too many connections",
which redis-py's default pool raises past 100 and the limiter would take for Redis being down.
"""

import asyncio
from collections.abc import Awaitable
from typing import Any

import redis.asyncio as redis
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.admission.config import SharedStateConfig
from gateway.admission.redis_scripts import FREE_SLOT, GIVE_BACK, IN_FLIGHT, RENEW, TAKE_SLOT, TAKE_TOKENS

UNAVAILABLE = (RedisError, OSError, TimeoutError)
"""What a call raises when Redis is down, unreachable, slow or restarting."""
CONNECTIONS = 100
"""Connections to Redis per gateway process, at most (redis-py's default pool size, but blocking)."""


class RedisStore:
    def __init__(self, config: SharedStateConfig) -> None:
        self.config = config
        self._calls: set[asyncio.Future] = set()
        self._open()

    def _open(self) -> None:
        self.client = _client(self.config)
        self.take_slot = self.client.register_script(TAKE_SLOT)
        self.free_slot = self.client.register_script(FREE_SLOT)
        self.take_tokens = self.client.register_script(TAKE_TOKENS)
        self.give_back = self.client.register_script(GIVE_BACK)
        self.renew = self.client.register_script(RENEW)
        self.in_flight = self.client.register_script(IN_FLIGHT)

    async def call(self, pending: Awaitable[Any]) -> Any:
        """The result of ``pending``, or TimeoutError once ``2 x timeout_s`` have passed."""
        call = asyncio.ensure_future(pending)
        self._calls.add(call)
        call.add_done_callback(_forget(self._calls))
        done, _ = await asyncio.wait({call}, timeout=self.config.timeout_s * 2)
        if not done:
            raise TimeoutError(f"no answer within {self.config.timeout_s * 2:g} s")
        return call.result()

    @property
    def calls_running(self) -> int:
        """Calls still running, those whose caller stopped waiting included."""
        return len(self._calls)

    async def ping(self) -> None:
        await self.call(self.client.ping())

    def reopen(self) -> None:
        """A fresh client (fresh connections); the old one closes in the background."""
        stale = self.client
        self._open()
        closing = asyncio.ensure_future(stale.aclose())
        self._calls.add(closing)
        closing.add_done_callback(_forget(self._calls))

    async def close(self) -> None:
        for call in list(self._calls):
            call.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        await self.client.aclose()


def _forget(calls: set[asyncio.Future]) -> Any:
    """A done-callback that drops a finished call and reads its outcome (no 'never retrieved' warning)."""

    def done(call: asyncio.Future) -> None:
        calls.discard(call)
        if not call.cancelled():
            call.exception()

    return done


def _client(config: SharedStateConfig) -> redis.Redis:
    """A client that waits at most ``timeout_s`` per connect or read, and retries once at once on a
    broken connection (a pooled one from before a Redis restart), never on a timeout."""
    pool = BlockingConnectionPool.from_url(
        config.redis_url,
        max_connections=CONNECTIONS,
        timeout=config.timeout_s * 2,
        socket_timeout=config.timeout_s,
        socket_connect_timeout=config.timeout_s,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )
    return redis.Redis.from_pool(pool)
