"""W3C Trace Context (``traceparent`` / ``tracestate``): read a caller's, continue it one hop.

``traceparent`` is ``00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>``. A hop keeps
the trace id and flags and names itself as the new parent; a missing or malformed header
starts a new, sampled trace. ``tracestate`` is passed on when it is valid W3C ``tracestate``
(printable ASCII list members, at most 512 characters) and dropped otherwise, as the spec asks:
a client's header bytes that are not ASCII must never reach a backend's request head.
"""

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.trace.span import TraceState

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_INVALID_TRACE_ID = "0" * 32
_INVALID_SPAN_ID = "0" * 16
_MAX_TRACESTATE_CHARS = 512
"""W3C: a vendor must propagate at least 512 characters and may drop a longer ``tracestate``."""
_VISIBLE_ASCII = re.compile(r"[\x20-\x7e]*")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    span_id: str
    """This hop's span: the parent id it forwards."""
    parent_id: str | None
    """The caller's span, None when this hop started the trace."""
    flags: str
    tracestate: str | None = None

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def headers(self) -> dict[str, str]:
        """The headers the next hop gets."""
        headers = {"traceparent": self.traceparent}
        if self.tracestate:
            headers["tracestate"] = self.tracestate
        return headers


def continue_trace(headers: Mapping[str, str]) -> TraceContext:
    """The caller's trace continued by a new span, or a new trace when it sent none (or a bad one)."""
    match = _TRACEPARENT.match((headers.get("traceparent") or "").strip().lower())
    span_id = secrets.token_hex(8)
    if match is None or match[1] == "ff" or match[2] == _INVALID_TRACE_ID or match[3] == _INVALID_SPAN_ID:
        return TraceContext(secrets.token_hex(16), span_id, None, "01")
    return TraceContext(match[2], span_id, match[3], match[4], valid_tracestate(headers.get("tracestate")))


def valid_tracestate(value: str | None) -> str | None:
    """``value`` in canonical W3C form, or None when it is absent, too long or not valid ``tracestate``."""
    if not value or len(value) > _MAX_TRACESTATE_CHARS or not is_visible_ascii(value):
        return None
    return TraceState.from_header([value]).to_header() or None


def is_visible_ascii(value: str) -> bool:
    """Whether ``value`` is printable ASCII only: safe to put in a request head and a log line as is."""
    return _VISIBLE_ASCII.fullmatch(value) is not None
