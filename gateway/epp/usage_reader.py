"""Usage and progress read from an answer Envoy relays to the client, chunk by chunk, as it passes.

A whole JSON answer is read once it has all arrived; a server-sent-event stream is read event by
event (keeping only an unfinished line between chunks), as gateway/backends/proxy.py reads the
streams it relays itself: chunks that carry output count as tokens, the last ``usage`` wins,
``data: [DONE]`` completes it. The result is the proxy's own ``UpstreamOutcome``, so telemetry,
the router and the tenant's budget settle an EPP request exactly as a proxied one.
"""

import time

import orjson

from gateway.backends.proxy import UpstreamOutcome, carries_output
from protocol.openai import chat_usage
from protocol.usage import parse_usage

MAX_WHOLE_BODY_BYTES = 8 << 20
"""A whole (non-streamed) answer longer than this is relayed unread: its usage is not counted."""


class UsageReader:
    def __init__(self) -> None:
        self.outcome = UpstreamOutcome(status=0)
        self._streamed = False
        self._pending = b""
        self._whole: list[bytes] = []
        self._whole_bytes = 0

    def on_headers(self, status: int, content_type: str) -> None:
        self.outcome.status = status
        self._streamed = content_type.startswith("text/event-stream")

    def on_chunk(self, data: bytes, end_of_stream: bool) -> None:
        if self._streamed:
            self._read_events(data)
        elif self._whole_bytes <= MAX_WHOLE_BODY_BYTES:
            self._whole.append(data)
            self._whole_bytes += len(data)
        if end_of_stream:
            self._finish()

    def _read_events(self, data: bytes) -> None:
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            self._read_line(line.rstrip(b"\r"))

    def _read_line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.outcome.completed = True
            return
        chunk = _json_object(payload)
        if chunk is None:
            return
        if carries_output(chunk):
            self.outcome.token_chunks += 1
            if self.outcome.first_token_at is None:
                self.outcome.first_token_at = time.perf_counter()
        if chunk.get("type") == "response.completed":  # the Responses API's last event carries the whole response
            response = chunk.get("response")
            chunk = response if isinstance(response, dict) else {}
            self.outcome.completed = True
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.outcome.usage = parse_usage(chat_usage(usage))
        error = chunk.get("error")
        if isinstance(error, dict):
            self.outcome.error_code = str(error.get("code") or error.get("type") or "error")

    def _finish(self) -> None:
        outcome = self.outcome
        if self._streamed:
            if self._pending:
                self._read_line(self._pending.rstrip(b"\r"))
                self._pending = b""
            return
        outcome.first_token_at = time.perf_counter()
        body = _json_object(b"".join(self._whole)) if self._whole_bytes <= MAX_WHOLE_BODY_BYTES else None
        self._whole = []
        if body is None:
            outcome.completed = outcome.status == 200
            return
        usage = body.get("usage")
        if isinstance(usage, dict):
            outcome.usage = parse_usage(chat_usage(usage))
        error = body.get("error")
        if isinstance(error, dict):
            outcome.error_code = str(error.get("code") or error.get("type") or "error")
        outcome.completed = outcome.status == 200


def _json_object(data: bytes) -> dict | None:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
