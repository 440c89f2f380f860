"""Forward one request to one backend and relay its answer, streamed or whole.

A failure before any byte reached the client raises ``UpstreamFailed`` so the caller may retry
on another replica; once the client has bytes, a failure ends its stream with an SSE error event,
and so does a backend stream that ends without ``[DONE]`` (the client would otherwise take a cut
answer for a whole one).
Streaming requests always ask the backend for usage (the gateway needs it for metrics and
calibration) and drop that final chunk again when the client did not ask for it. Timeouts are
one timer the upstream client arms for the answer's head, then ``asyncio.timeout`` scopes only
where a read can wait (a body or stream still arriving), never ``wait_for`` (a task per call and
per streamed line).
A Responses stream (``stream_format="responses"``) carries its usage in its closing
``response.completed`` (or ``.incomplete``) event and ends without ``[DONE]``; it is relayed
untouched up to the cap (past it, the gateway closes it with ``response.incomplete``).

The call's ``outcome`` is filled in as the answer flows, so the caller can still read what was
relayed (token-bearing chunks, usage) when the client leaves and the handler is cancelled. A
stream that goes past the granted ``max_tokens`` (all ``n`` samples together) is ended by the
gateway itself (finish reason ``length``), whatever the backend does.

Requests carry the replica's upstream headers (API key, extra headers) and the trace context;
the replica's configured secrets are redacted from everything relayed (``secret_redaction.py``);
a 5xx answer raises ``UpstreamAnswered`` (``answered_errors.py`` decides whose fault it is), and an
error body that is not OpenAI-shaped (vLLM's ``{"detail": "Not Found"}`` for an endpoint it does
not serve) is wrapped in one (``upstream_error.py``).
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp import web
from opentelemetry import trace

from gateway.anthropic.native_stream import END_EVENT, OUTPUT_EVENT, NativeStreamReader, failure_event, native_usage
from gateway.backends.secret_redaction import NO_SECRETS, Redactor
from gateway.backends.upstream_client import UnsendableHeader, UpstreamClient, UpstreamResponse
from gateway.backends.upstream_error import openai_error_body
from gateway.config import TimeoutsConfig
from gateway.errors import OpenAIError
from protocol.openai import chat_usage
from protocol.tracing import inject_current, span
from protocol.usage import Usage, parse_usage


class UpstreamFailed(Exception):
    """The backend failed before the client got anything; safe to retry elsewhere."""


class UpstreamAnswered(UpstreamFailed):
    """The backend answered a 5xx before the client got anything: it is up, and the request itself
    may be the cause (``answered_errors.py`` decides whose fault it is). ``message``: the error's
    text, redacted."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"backend answered {status}")
        self.status = status
        self.message = _error_message(body)


@dataclass
class UpstreamOutcome:
    status: int
    usage: Usage | None = None
    first_token_at: float | None = None
    """`time.perf_counter()` when the first token (or the whole body) arrived; None for a stream
    that carried no output."""
    completed: bool = False
    """The backend finished the answer (a stream reached [DONE], a body arrived whole)."""
    client_gone: bool = False
    token_chunks: int = 0
    """Streamed chunks relayed that carried generated text: each holds at least one token."""
    capped: bool = False
    """The backend streamed past the granted max_tokens and the gateway ended the stream."""
    error_code: str | None = None
    """A backend's error answer's ``error.code`` (else its ``type``), for the request log."""

    @property
    def prefilled(self) -> bool:
        """The replica prefilled the prompt (its first token came): it holds the prompt's blocks
        however the answer ends, a client gone mid-stream included (a replica keeps a cancelled
        request's blocks in its prefix cache)."""
        return self.status == 200 and self.first_token_at is not None

    @property
    def completed_output_tokens(self) -> int | None:
        """The answer's length, from the engine's usage, when the replica finished it (not an error,
        not a client gone, not a stream the gateway capped)."""
        if self.status != 200 or not self.completed or self.capped or self.usage is None:
            return None
        return self.usage.completion_tokens

    @property
    def generated_at_least(self) -> int:
        """Completion tokens the client got, from the engine's usage when it came, else counted."""
        reported = self.usage.completion_tokens if self.usage else None
        return reported if reported is not None else self.token_chunks


@dataclass
class ProxyCall:
    client: UpstreamClient
    url: str
    body: dict
    stream: bool
    include_usage: bool
    headers: dict[str, str]
    """Headers the gateway adds to the client's response."""
    timeouts: TimeoutsConfig
    max_tokens: int
    """The cap the gateway granted; a stream that goes past it is ended here."""
    prompt_tokens: int
    on_first_token: Callable[[], None] = lambda: None
    """Called once when the first streamed event carrying output arrives (the backend's prefill is done)."""
    on_sent: Callable[[], None] = lambda: None
    """Called once the request is on its way, before the call first waits (see ``UpstreamClient.post``)."""
    outcome: UpstreamOutcome = field(default_factory=lambda: UpstreamOutcome(status=0))
    """Filled in as the answer flows; ``forward`` returns it."""
    upstream_headers: dict[str, str] = field(default_factory=dict)
    """Headers sent to the backend beside Content-Type (Authorization, extra headers, traceparent)."""
    stream_format: str = "chat"
    """``chat`` (chat and text completions: ``data:`` chunks, ``[DONE]``), ``responses``, or
    ``anthropic`` (a backend's own ``/v1/messages``: its usage and events are Anthropic's)."""
    native_stream: NativeStreamReader = field(default_factory=NativeStreamReader)
    """What an ``anthropic`` stream's events said so far."""
    redactor: Redactor = NO_SECRETS
    """The backend's configured secrets, redacted from everything relayed to the client."""
    stream_response: Callable[..., web.StreamResponse] = web.StreamResponse
    """Makes the client's streamed response (``status=``, ``headers=``): a front end's may translate the events."""


async def forward(call: ProxyCall, client_request: web.Request) -> tuple[web.StreamResponse, UpstreamOutcome]:
    """The call under a `gateway.upstream` span, whose id the backend gets as its parent."""
    with span("gateway.upstream", kind=trace.SpanKind.CLIENT):
        return await _forward(call, client_request)


async def _forward(call: ProxyCall, client_request: web.Request) -> tuple[web.StreamResponse, UpstreamOutcome]:
    body = call.body
    if call.stream and call.stream_format == "chat":
        body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
    try:
        upstream = await call.client.post(
            call.url,
            orjson.dumps(body),
            inject_current(dict(call.upstream_headers)),
            call.timeouts.connect_s,
            call.on_sent,
            timeout_s=call.timeouts.first_token_s,
        )
    except UnsendableHeader as exc:
        raise OpenAIError(500, f"The gateway cannot forward this request: {exc}", "server_error") from None
    except (TimeoutError, OSError) as exc:
        raise UpstreamFailed(f"cannot reach backend: {exc!r}") from exc
    try:
        if upstream.status != 200 or not call.stream:
            return await _relay_whole(call, upstream)
        return await _relay_stream(call, upstream, client_request)
    finally:
        upstream.release()


async def _relay_whole(call: ProxyCall, upstream: UpstreamResponse) -> tuple[web.StreamResponse, UpstreamOutcome]:
    try:
        if upstream.whole:  # the usual case: no wait, so no timer to arm
            data = await upstream.read()
        else:
            async with asyncio.timeout(call.timeouts.first_token_s):
                data = await upstream.read()
    except (TimeoutError, OSError) as exc:
        raise UpstreamFailed(f"backend failed while answering: {exc!r}") from exc
    data = await _redacted(call.redactor, data)
    if upstream.status >= 400:
        data = openai_error_body(upstream.status, data, urlsplit(call.url).path, call.body.get("model"))
    if upstream.status >= 500:
        raise UpstreamAnswered(upstream.status, data)
    arrived = time.perf_counter()
    outcome = call.outcome
    outcome.status, outcome.first_token_at = upstream.status, arrived
    if upstream.status == 200:
        outcome.completed = True
        outcome.usage = parse_usage(native_usage(data) if call.stream_format == "anthropic" else _usage_of(data))
    else:
        outcome.error_code = _error_code(data)
    content_type = call.redactor.redact_text(upstream.content_type or "application/json")
    if upstream.status >= 400:
        content_type = "application/json"
    response = web.Response(status=upstream.status, body=data, content_type=content_type, headers=call.headers)
    return response, outcome


async def _relay_stream(
    call: ProxyCall, upstream: UpstreamResponse, client_request: web.Request
) -> tuple[web.StreamResponse, UpstreamOutcome]:
    outcome = call.outcome
    outcome.status = 200
    events = _sse_events(upstream, call.timeouts)
    try:
        first = await anext(events)
    except (TimeoutError, StopAsyncIteration, OSError) as exc:
        raise UpstreamFailed(f"backend stream failed before its first event: {exc!r}") from exc
    response = call.stream_response(
        status=200, headers={**call.headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(client_request)
    failure: str | None = None
    try:
        with span("gateway.stream"):
            await _write_event(call, response, outcome, first)
            async for event in events:
                await _write_event(call, response, outcome, event)
                if outcome.capped:
                    upstream.close()
                    break
        if not outcome.completed:
            failure = "backend stream ended before [DONE]"
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        outcome.client_gone = True
        return response, outcome
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        failure = f"backend stream ended abnormally: {type(exc).__name__}"
    if failure is not None:
        await _write_quietly(response, _failure_event(call, failure))
    await _write_eof_quietly(response)
    return response, outcome


def _failure_event(call: ProxyCall, failure: str) -> bytes:
    """The SSE event that ends a broken stream: an error chunk, or a Responses `error` event."""
    if call.stream_format == "anthropic":
        return failure_event(failure)
    if call.stream_format == "responses":
        event = {"type": "error", "code": "upstream_error", "message": failure, "param": None}
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
    return b"data: " + orjson.dumps(OpenAIError(502, failure, "upstream_error").body()) + b"\n\n"


def _first_token(call: ProxyCall, outcome: UpstreamOutcome) -> None:
    outcome.first_token_at = time.perf_counter()
    call.on_first_token()


async def _write_event(call: ProxyCall, response: web.StreamResponse, outcome: UpstreamOutcome, event: bytes) -> None:
    event = await _redacted(call.redactor, event)
    if call.stream_format == "anthropic":
        await _write_anthropic_event(call, response, outcome, event)
        return
    if call.stream_format == "responses":
        _read_responses_event(outcome, event)
        delta = any(kind in event for kind in _RESPONSES_DELTAS)
        if outcome.first_token_at is None and (delta or outcome.completed):
            _first_token(call, outcome)
        if delta:
            if outcome.token_chunks >= call.max_tokens:
                await _end_responses_at_cap(call, response, outcome)
                return
            outcome.token_chunks += 1
        await response.write(event)
        return
    payload = event.removeprefix(b"data: ").strip()
    if payload == b"[DONE]":
        outcome.completed = True
        await response.write(event)
        return
    chunk = _json_or_none(payload)
    if chunk is not None and carries_output(chunk):
        if outcome.first_token_at is None:
            _first_token(call, outcome)
        if outcome.token_chunks >= call.max_tokens:
            await _end_at_cap(call, response, outcome, chunk)
            return
        outcome.token_chunks += 1
    if chunk is not None and chunk.get("usage"):
        outcome.usage = parse_usage(chunk["usage"])
        if not call.include_usage and not chunk.get("choices"):
            return
        if not call.include_usage:
            event = b"data: " + orjson.dumps({**chunk, "usage": None}) + b"\n\n"
    await response.write(event)


def carries_output(chunk: dict) -> bool:
    """Whether a streamed chunk holds generated output: text, logprobs, or a delta other than the
    bare role (content, tool calls, a refusal, reasoning).

    Backends may send chunks before the first token (the role alone, as some engines do before
    their prefill); those do not count, so time to first token, the router's prefill accounting
    and the token cap stay true whatever the backend sends first.
    """
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if choice.get("text") or choice.get("logprobs"):
            return True
        if isinstance(delta, dict) and any(value for key, value in delta.items() if key != "role"):
            return True
    return False


async def _end_at_cap(call: ProxyCall, response: web.StreamResponse, outcome: UpstreamOutcome, chunk: dict) -> None:
    """The backend went past the granted cap: finish the client's stream as if it stopped there."""
    outcome.capped = outcome.completed = True
    usage = {
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": call.max_tokens,
        "total_tokens": call.prompt_tokens + call.max_tokens,
    }
    outcome.usage = parse_usage(usage)
    shape = "delta" if chunk.get("object") == "chat.completion.chunk" else "text"
    finish = {"index": 0, shape: {} if shape == "delta" else "", "logprobs": None, "finish_reason": "length"}
    events = [{**chunk, "choices": [finish], "usage": None}]
    if call.include_usage:
        events.append({**chunk, "choices": [], "usage": usage})
    await response.write(b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events) + b"data: [DONE]\n\n")


async def _write_anthropic_event(
    call: ProxyCall, response: web.StreamResponse, outcome: UpstreamOutcome, event: bytes
) -> None:
    """Relay a backend's own Anthropic event as it is, noting output, usage and the end; past the
    granted cap, close the stream with ``stop_reason: max_tokens`` instead."""
    kind = call.native_stream.read(event)
    if kind == OUTPUT_EVENT:
        if outcome.first_token_at is None:
            _first_token(call, outcome)
        if outcome.token_chunks >= call.max_tokens:
            outcome.capped = outcome.completed = True
            outcome.usage = Usage(
                prompt_tokens=call.prompt_tokens,
                completion_tokens=call.max_tokens,
                total_tokens=call.prompt_tokens + call.max_tokens,
                cached_tokens=call.native_stream.usage.get("cache_read_input_tokens"),
            )
            await response.write(call.native_stream.closing_events(call.max_tokens))
            return
        outcome.token_chunks += 1
    elif kind == END_EVENT:
        outcome.completed = True
        if outcome.first_token_at is None:
            _first_token(call, outcome)
    if call.native_stream.final_usage is not None:
        outcome.usage = parse_usage(call.native_stream.final_usage)
    await response.write(event)


async def _end_responses_at_cap(call: ProxyCall, response: web.StreamResponse, outcome: UpstreamOutcome) -> None:
    """A Responses stream went past the granted cap: close it as an answer cut at max_output_tokens."""
    outcome.capped = outcome.completed = True
    outcome.usage = Usage(
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.max_tokens,
        total_tokens=call.prompt_tokens + call.max_tokens,
    )
    closing = {
        "type": "response.incomplete",
        "response": {
            "object": "response",
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "usage": {
                "input_tokens": call.prompt_tokens,
                "output_tokens": call.max_tokens,
                "total_tokens": call.prompt_tokens + call.max_tokens,
            },
        },
    }
    await response.write(b"event: response.incomplete\ndata: " + orjson.dumps(closing) + b"\n\n")


async def _sse_events(content: UpstreamResponse, timeouts: TimeoutsConfig) -> AsyncIterator[bytes]:
    """Whole SSE events (terminated by a blank line), with first-token and idle timeouts."""
    pending = bytearray()
    wait_s = timeouts.first_token_s
    while True:
        async with asyncio.timeout(wait_s):
            line = await content.readline()
        if not line:
            if pending.strip():
                yield bytes(pending) + b"\n"
            return
        pending += line
        if line in (b"\n", b"\r\n") and pending.strip():
            yield bytes(pending)
            pending.clear()
            wait_s = timeouts.idle_stream_s


_RESPONSES_DELTAS = (b'"response.output_text.delta"', b'"response.function_call_arguments.delta"')
"""The Responses events that carry generated tokens (text, or a function call's arguments)."""
_RESPONSES_END = {"response.completed": True, "response.incomplete": True, "response.failed": False}
"""The closing events of a Responses stream, and whether each means the backend finished the answer."""


def _read_responses_event(outcome: UpstreamOutcome, event: bytes) -> None:
    """Note the end of a Responses stream and its usage (in chat terms) from its closing event."""
    if b'"response.' not in event or b'"usage"' not in event:
        return
    data = b"".join(line.removeprefix(b"data:") for line in event.splitlines() if line.startswith(b"data:"))
    payload = _json_or_none(data.strip())
    if payload is None or payload.get("type") not in _RESPONSES_END:
        return
    outcome.completed = _RESPONSES_END[payload["type"]]
    usage = (payload.get("response") or {}).get("usage")
    outcome.usage = parse_usage(chat_usage(usage)) if isinstance(usage, dict) else None


_REDACT_OFF_LOOP_BYTES = 32 << 10
"""Bodies at least this large are searched for secrets on a worker thread, not on the event loop."""


async def _redacted(redactor: Redactor, data: bytes) -> bytes:
    if not redactor:
        return data
    if len(data) < _REDACT_OFF_LOOP_BYTES:
        return redactor.redact(data)
    return await asyncio.to_thread(redactor.redact, data)


_MAX_ERROR_MESSAGE_CHARS = 300


def _error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI error body."""
    parsed = _json_or_none(body)
    error = parsed.get("error") if parsed else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or "no detail")[:_MAX_ERROR_MESSAGE_CHARS]


def _error_code(body: bytes) -> str | None:
    """The ``error.code`` of an OpenAI error body, else its ``error.type``."""
    parsed = _json_or_none(body)
    error = parsed.get("error") if parsed else None
    code = (error.get("code") or error.get("type")) if isinstance(error, dict) else None
    return str(code)[:_MAX_ERROR_MESSAGE_CHARS] if code else None


def _usage_of(data: bytes) -> dict | None:
    body = _json_or_none(data)
    usage = body.get("usage") if body else None
    return chat_usage(usage) if isinstance(usage, dict) else None


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
