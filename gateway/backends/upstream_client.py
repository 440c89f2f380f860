"""The HTTP/1.1 client the gateway forwards requests with: keep-alive connections, httptools' parser.

aiohttp's ``ClientSession.post`` cost about 130 us of CPU a call on the overhead benchmark (its
request and response objects, cookie jar, timers, middlewares and stream readers), a sixth of
the gateway's whole per-request cost (bench/RESULTS.md, issue 12). Forwarding needs much less:
one POST of bytes already serialized, then the answer's status, headers and body as they arrive.
This is that: a request written with one ``writelines``, the answer parsed by ``httptools``
(llhttp, as Node.js and uvicorn use it), which handles ``Content-Length``, chunked and
read-until-close bodies. Connections are kept per (scheme, host, port) and reused only after
an answer was read whole on a connection the server keeps open; any other ends in a close.
Reading pauses the socket while more than ``HIGH_WATER_BYTES`` wait unread (back-pressure for a
slow client). Health checks and model listings stay on aiohttp.

No retry happens here: a request that fails is the caller's to retry (on another replica).
"""

import asyncio
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import cast
from urllib.parse import urlsplit

import httptools

HIGH_WATER_BYTES = 256 << 10
"""Unread body bytes past which the socket stops being read until the reader catches up."""


class UpstreamError(ConnectionError):
    """The connection failed, closed before the answer was whole, or the answer was not HTTP."""


class UnsendableHeader(UpstreamError):
    """A header that cannot go into a request head: nothing was sent, and no backend is at fault."""

    def __init__(self, name: str) -> None:
        shown = name if _HEADER_NAME.fullmatch(name) else ascii(name[:40])
        super().__init__(f"header {shown} holds a line break, a colon or a character outside printable ASCII; not sent")
        self.header = shown


@dataclass(frozen=True)
class _Target:
    key: tuple[str, str, int]
    """(scheme, host, port): the connections it may share."""
    path: str
    host_header: str
    tls: bool


@lru_cache(maxsize=1024)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target((parts.scheme, parts.hostname, port), path, parts.netloc.rpartition("@")[2], tls)


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class _Connection(asyncio.Protocol):
    """One socket and the answer being read on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: dict[str, str] | None = None
        self.status = 0
        self.body = bytearray()
        self.complete = False
        self._keep_alive = False
        self.error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.timed_out = False
        """The caller's deadline for the answer's head passed (``time_out``)."""

    def start(self) -> None:
        """Ready the connection for the next answer."""
        self._parser = httptools.HttpResponseParser(self)
        self.headers, self.status, self.complete, self._keep_alive = None, 0, False, False
        self.timed_out = False
        self._raw_headers.clear()
        self.body.clear()

    @property
    def reusable(self) -> bool:
        return self.complete and self._keep_alive and not self.closed and self.error is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"the backend's answer is not valid HTTP: {exc}"))
            self.close()
            self._wake()
            return
        if len(self.body) > HIGH_WATER_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers is not None and not self.complete and self._reads_until_close():
            self.complete = True
        elif not self.complete:
            reason = f": {exc!r}" if exc else ""
            self._fail(UpstreamError(f"the backend closed the connection before its answer was whole{reason}"))
        self._wake()

    def _reads_until_close(self) -> bool:
        """An answer with neither a length nor chunks ends when the server closes (RFC 9112 6.3)."""
        names = self.headers or {}
        return "content-length" not in names and "chunked" not in names.get("transfer-encoding", "")

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            self._raw_headers.clear()  # an interim answer (103 Early Hints, say): the real one follows
            return
        self.status = status
        self.headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self._raw_headers}

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        if self.headers is None:
            return
        self._keep_alive = self._parser.should_keep_alive()  # read now: the parser forgets it after the message
        self.complete = True

    async def wait(self) -> None:
        """Until more of the answer arrived (or it ended, or failed)."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self, size: int | None = None) -> bytes:
        """Up to ``size`` unread body bytes (all when None), resuming a paused socket."""
        if size is None or size >= len(self.body):
            data = bytes(self.body)
            self.body.clear()
        else:
            data = bytes(self.body[:size])
            del self.body[:size]
        if self._paused and len(self.body) <= HIGH_WATER_BYTES // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def time_out(self) -> None:
        """The deadline for the answer's head passed: wake the waiting ``post``, which gives up."""
        self.timed_out = True
        self._wake()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class UpstreamResponse:
    """A backend's answer: status and headers at once, the body as it arrives."""

    def __init__(self, client: "UpstreamClient", key: tuple[str, str, int], connection: _Connection) -> None:
        self._client = client
        self._key = key
        self._connection: _Connection | None = connection
        assert connection.headers is not None
        self.status = connection.status
        self.headers = connection.headers

    @property
    def content_type(self) -> str:
        """The media type of ``Content-Type`` without its parameters ("" when absent)."""
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    @property
    def whole(self) -> bool:
        """The whole answer has arrived: ``read`` returns it without waiting."""
        return self._connection is not None and self._connection.complete

    async def read(self) -> bytes:
        """The whole body."""
        connection = self._open()
        parts = []
        while not connection.complete:
            self._check(connection)
            if len(connection.body) > HIGH_WATER_BYTES:
                parts.append(connection.take())
            await connection.wait()
        parts.append(connection.take())
        return b"".join(parts)

    async def readline(self) -> bytes:
        """The next line with its ``\\n``; what is left at the end; b"" once the body is read."""
        connection = self._open()
        parts = []
        while True:
            end = connection.body.find(b"\n")
            if end >= 0:
                parts.append(connection.take(end + 1))
                return b"".join(parts)
            if connection.complete:
                parts.append(connection.take())
                return b"".join(parts)
            self._check(connection)
            if len(connection.body) > HIGH_WATER_BYTES:
                parts.append(connection.take())
            await connection.wait()

    def release(self) -> None:
        """Give the connection back for reuse when the answer was read whole, else close it."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.reusable and not connection.body:
            self._client.give_back(self._key, connection)
        else:
            connection.close()

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _open(self) -> _Connection:
        if self._connection is None:
            raise UpstreamError("the answer was released")
        return self._connection

    @staticmethod
    def _check(connection: _Connection) -> None:
        if connection.error is not None:
            raise connection.error


class UpstreamClient:
    """Keep-alive connections to the backends, by (scheme, host, port)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        connect_timeout_s: float,
        on_sent: Callable[[], None] = lambda: None,
        timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send ``body`` and wait for the answer's status and headers.

        ``headers`` are added to Host, Content-Length and Content-Type (application/json);
        raises UpstreamError when no answer came, TimeoutError when none came within
        ``timeout_s`` (connecting included; one timer, cheaper than an ``asyncio.timeout``
        scope around the call). ``on_sent`` runs before the first wait: once the request is
        written on a kept-alive connection (its work then overlaps the backend's), else before
        connecting.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        target = _target(url)
        head = _request_head(target, len(body), headers)
        connection = self._idle_connection(target.key)
        if connection is None:
            on_sent()
            connect_s = connect_timeout_s if timeout_s is None else min(connect_timeout_s, timeout_s)
            connection = await self._connect(target, connect_s)
            on_sent = _nothing
        connection.start()
        assert connection.transport is not None
        timer = None if deadline is None else loop.call_at(deadline, connection.time_out)
        try:
            connection.transport.writelines([head, body])
            on_sent()
            while connection.headers is None:
                if connection.error is not None:
                    raise connection.error
                if connection.timed_out:
                    raise TimeoutError(f"no answer from {target.key[1]}:{target.key[2]} within {timeout_s:g} s")
                await connection.wait()
        except BaseException:
            connection.close()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return UpstreamResponse(self, target.key, connection)

    def give_back(self, key: tuple[str, str, int], connection: _Connection) -> None:
        self._idle.setdefault(key, []).append(connection)

    def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    def _idle_connection(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.transport is not None and not connection.transport.is_closing():
                return connection
        return None

    async def _connect(self, target: _Target, timeout_s: float) -> _Connection:
        _, host, port = target.key
        tls = _tls_context() if target.tls else None
        try:
            async with asyncio.timeout(timeout_s):
                _, connection = await asyncio.get_running_loop().create_connection(_Connection, host, port, ssl=tls)
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {host}:{port}: {exc!r}") from exc
        return connection


def _nothing() -> None:
    return None


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""RFC 9110 ``token``."""
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
"""Printable ASCII and tabs: what a request head may carry without an encoding to agree on."""


def _request_head(target: _Target, length: int, headers: dict[str, str]) -> bytes:
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host_header}", f"Content-Length: {length}"]
    lines.append("Content-Type: application/json")
    for name, value in headers.items():
        if name.lower() in ("host", "content-length", "content-type"):
            continue
        if _HEADER_NAME.fullmatch(name) is None or _HEADER_VALUE.fullmatch(value) is None:
            raise UnsendableHeader(name)
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("ascii")
