"""Reading a backend's own Anthropic event stream while the proxy relays it untouched.

A backend that serves ``/v1/messages`` (``backends[].anthropic_messages``) streams Anthropic's
events. The proxy needs from them what it reads from chat chunks: which events carry output
(``content_block_delta``: one token at least), the usage (``message_start`` for the prompt side,
``message_delta`` for the final counts), the end (``message_stop``), and, to end a stream that
goes past the granted ``max_tokens``, the events that close it as Anthropic would.
"""

from dataclasses import dataclass, field
from typing import Any

import orjson

from protocol.anthropic import chat_usage_of_anthropic

OUTPUT_EVENT = "content_block_delta"
END_EVENT = "message_stop"


@dataclass
class NativeStreamReader:
    """What the events seen so far say: the open content block and the usage."""

    open_block: int | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    """Anthropic's usage fields, from ``message_start`` then updated by ``message_delta``."""
    final_usage: dict[str, Any] | None = None
    """The usage in chat terms once ``message_delta`` reported the output count, else None (a
    partial count must not be charged as the whole)."""

    def read(self, event: bytes) -> str | None:
        """The event's ``type`` (None when it is no JSON event), noting its block and usage."""
        payload = _payload(event)
        if payload is None:
            return None
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message")
            self._add_usage(message.get("usage") if isinstance(message, dict) else None)
        elif kind == "content_block_start":
            index = payload.get("index")
            self.open_block = index if isinstance(index, int) else 0
        elif kind == "content_block_stop":
            self.open_block = None
        elif kind == "message_delta":
            self._add_usage(payload.get("usage"))
            self.final_usage = chat_usage_of_anthropic(self.usage)
        return kind if isinstance(kind, str) else None

    def _add_usage(self, usage: object) -> None:
        if isinstance(usage, dict):
            self.usage.update({key: value for key, value in usage.items() if isinstance(value, int)})

    def closing_events(self, output_tokens: int) -> bytes:
        """The events that end the stream at the cap: the open block closed, ``stop_reason: max_tokens``."""
        events: list[dict[str, Any]] = []
        if self.open_block is not None:
            events.append({"type": "content_block_stop", "index": self.open_block})
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            }
        )
        events.append({"type": "message_stop"})
        return b"".join(_event(event) for event in events)


def failure_event(message: str) -> bytes:
    """Anthropic's ``error`` event, ending a stream the backend broke."""
    return _event({"type": "error", "error": {"type": "api_error", "message": message}})


def native_usage(data: bytes) -> dict[str, Any] | None:
    """A whole Messages answer's usage in chat terms; None when it has none."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    usage = body.get("usage") if isinstance(body, dict) else None
    return chat_usage_of_anthropic(usage) if isinstance(usage, dict) else None


def _payload(event: bytes) -> dict[str, Any] | None:
    data = b"".join(line.removeprefix(b"data:") for line in event.splitlines() if line.startswith(b"data:"))
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
