"""Forward one request to one backend and relay its answer, streamed or whole.

A failure before any byte reached the client raises ``UpstreamFailed`` so the caller may retry
on another replica; once the client has bytes, a failure ends its stream with an SSE error event,
and so does a backend stream that ends without ``[DONE]`` (the client would otherwise take a cut
answer for a whole one).
Streaming requests always ask the backend for usage (the gateway needs it for metrics and
calibration) and drop that final chunk again when the client did not ask for it.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from gateway.config import TimeoutsConfig
from gateway.errors import OpenAIError


class UpstreamFailed(Exception):
    """The backend failed before the client got anything; safe to retry elsewhere."""


@dataclass
class UpstreamOutcome:
    status: int
    usage: dict | None = None
    first_token_at: float | None = None
    """`time.perf_counter()` when the first token (or the whole body) arrived."""
    completed: bool = False
    """The backend finished the answer (a stream reached [DONE], a body arrived whole)."""
    client_gone: bool = False


@dataclass
class ProxyCall:
    session: aiohttp.ClientSession
    url: str
    body: dict
    stream: bool
    include_usage: bool
    headers: dict[str, str]
    """Headers the gateway adds to the client's response."""
    timeouts: TimeoutsConfig
    on_first_token: Callable[[], None] = lambda: None
    """Called once when the first streamed event arrives (the backend's prefill is done)."""


async def forward(call: ProxyCall, client_request: web.Request) -> tuple[web.StreamResponse, UpstreamOutcome]:
    body = call.body
    if call.stream:
        body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
    timeout = aiohttp.ClientTimeout(sock_connect=call.timeouts.connect_s, sock_read=None)
    try:
        upstream = await asyncio.wait_for(
            call.session.post(
                call.url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}, timeout=timeout
            ),
            call.timeouts.first_token_s,
        )
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise UpstreamFailed(f"cannot reach backend: {exc!r}") from exc
    try:
        if upstream.status != 200 or not call.stream:
            return await _relay_whole(call, upstream)
        return await _relay_stream(call, upstream, client_request)
    finally:
        upstream.release()


async def _relay_whole(call: ProxyCall, upstream: aiohttp.ClientResponse) -> tuple[web.StreamResponse, UpstreamOutcome]:
    try:
        data = await asyncio.wait_for(upstream.read(), call.timeouts.first_token_s)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise UpstreamFailed(f"backend failed while answering: {exc!r}") from exc
    if upstream.status >= 500:
        raise UpstreamFailed(f"backend answered {upstream.status}")
    arrived = time.perf_counter()
    outcome = UpstreamOutcome(status=upstream.status, first_token_at=arrived)
    if upstream.status == 200:
        outcome.completed = True
        outcome.usage = _usage_of(data)
    response = web.Response(
        status=upstream.status,
        body=data,
        content_type=upstream.content_type or "application/json",
        headers=call.headers,
    )
    return response, outcome


async def _relay_stream(
    call: ProxyCall, upstream: aiohttp.ClientResponse, client_request: web.Request
) -> tuple[web.StreamResponse, UpstreamOutcome]:
    outcome = UpstreamOutcome(status=200)
    events = _sse_events(upstream.content, call.timeouts)
    try:
        first = await anext(events)
    except (TimeoutError, StopAsyncIteration, aiohttp.ClientError, OSError) as exc:
        raise UpstreamFailed(f"backend stream failed before its first event: {exc!r}") from exc
    outcome.first_token_at = time.perf_counter()
    call.on_first_token()
    response = web.StreamResponse(
        status=200, headers={**call.headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(client_request)
    failure: str | None = None
    try:
        await _write_event(call, response, outcome, first)
        async for event in events:
            await _write_event(call, response, outcome, event)
        if not outcome.completed:
            failure = "backend stream ended before [DONE]"
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        outcome.client_gone = True
        return response, outcome
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        failure = f"backend stream ended abnormally: {type(exc).__name__}"
    if failure is not None:
        error = OpenAIError(502, failure, "upstream_error")
        await _write_quietly(response, b"data: " + orjson.dumps(error.body()) + b"\n\n")
    await _write_eof_quietly(response)
    return response, outcome


async def _write_event(call: ProxyCall, response: web.StreamResponse, outcome: UpstreamOutcome, event: bytes) -> None:
    payload = event.removeprefix(b"data: ").strip()
    if payload == b"[DONE]":
        outcome.completed = True
    elif b'"usage"' in payload and b'"usage":null' not in payload:
        chunk = _json_or_none(payload)
        if chunk is not None and chunk.get("usage"):
            outcome.usage = chunk["usage"]
            if not call.include_usage and not chunk.get("choices"):
                return
            if not call.include_usage:
                event = b"data: " + orjson.dumps({**chunk, "usage": None}) + b"\n\n"
    await response.write(event)


async def _sse_events(content: aiohttp.StreamReader, timeouts: TimeoutsConfig) -> AsyncIterator[bytes]:
    """Whole SSE events (terminated by a blank line), with first-token and idle timeouts."""
    pending = bytearray()
    wait_s = timeouts.first_token_s
    while True:
        line = await asyncio.wait_for(content.readline(), wait_s)
        if not line:
            if pending.strip():
                yield bytes(pending) + b"\n"
            return
        pending += line
        if line in (b"\n", b"\r\n") and pending.strip():
            yield bytes(pending)
            pending.clear()
            wait_s = timeouts.idle_stream_s


def _usage_of(data: bytes) -> dict | None:
    body = _json_or_none(data)
    return body.get("usage") if body else None


def _json_or_none(data: bytes) -> dict | None:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


async def _write_quietly(response: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await response.write(data)


async def _write_eof_quietly(response: web.StreamResponse) -> None:
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await response.write_eof()
