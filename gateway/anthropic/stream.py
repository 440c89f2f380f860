"""A backend's chat-completion SSE stream as Anthropic's event sequence, translated chunk by chunk.

``message_start`` and a ``ping`` open the stream; each text delta or tool-call delta becomes a
``content_block_delta`` (``text_delta`` / ``input_json_delta``) inside its block's
``content_block_start`` / ``content_block_stop``; ``[DONE]`` becomes ``message_delta`` (stop
reason and usage, which the final usage chunk carried) and ``message_stop``. An error chunk (the
proxy's, for a broken backend stream) becomes an ``error`` event. Nothing is buffered beyond the
chunk in hand.

``AnthropicEventStream`` is the response the proxy streams into: every ``write`` it makes (whole
SSE events, see gateway/backends/proxy.py) is translated before it reaches the client, so the
proxy's token cap, usage and first-token accounting work on the chat chunks as for any stream.
"""

from typing import Any

import orjson
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_request import BaseRequest

from gateway.anthropic.errors import error_type
from gateway.anthropic.response import CacheAccounting, anthropic_usage, stop_reason


def sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class StreamTranslator:
    """The state of one translated stream: open block, tool calls seen, stop reason, usage."""

    def __init__(
        self, message_id: str, model: str, prompt_tokens: int, stop_sequences: list[str], accounting: CacheAccounting
    ) -> None:
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.stop_sequences = stop_sequences
        self.accounting = accounting
        self._blocks = 0
        """Content blocks started so far; the open one (if any) is the last."""
        self._open: str | None = None
        """The open block's kind: ``text``, or ``tool:<index>`` for a tool call."""
        self._choice: dict[str, Any] = {}
        self._used_tools = False
        self._usage: dict[str, Any] | None = None
        self.ended = False

    def opening(self) -> bytes:
        usage = {
            "input_tokens": self.prompt_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 0,
        }
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return sse({"type": "message_start", "message": message}) + sse({"type": "ping"})

    def feed(self, data: bytes) -> bytes:
        """The Anthropic events for one or more whole SSE events of the backend's stream."""
        out = bytearray()
        for event in data.split(b"\n\n"):
            payload = b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
            if payload and not self.ended:
                out += self._translate(payload)
        return bytes(out)

    def _translate(self, payload: bytes) -> bytes:
        if payload == b"[DONE]":
            return self._closing()
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        if isinstance(chunk.get("error"), dict):
            self.ended = True
            message = str(chunk["error"].get("message") or "backend stream failed")
            return sse({"type": "error", "error": {"type": error_type(502), "message": message}})
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        out = bytearray()
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._choice_events(choice)
        return bytes(out)

    def _choice_events(self, choice: dict[str, Any]) -> bytes:
        out = bytearray()
        delta = choice.get("delta") or {}
        if delta.get("content"):
            out += self._enter("text", {"type": "text", "text": ""})
            out += self._delta({"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or []:
            out += self._tool_call_delta(call)
        if choice.get("finish_reason"):
            self._choice = choice
        return bytes(out)

    def _tool_call_delta(self, call: dict[str, Any]) -> bytes:
        out = bytearray()
        function = call.get("function") or {}
        kind = f"tool:{call.get('index', 0)}"
        if self._open != kind:
            self._used_tools = True
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{self.message_id[4:]}",
                "name": function.get("name") or "",
                "input": {},
            }
            out += self._enter(kind, block)
        if function.get("arguments"):
            out += self._delta({"type": "input_json_delta", "partial_json": function["arguments"]})
        return bytes(out)

    def _enter(self, kind: str, block: dict[str, Any]) -> bytes:
        """Start a block of ``kind`` unless it is the open one (closing the open one first)."""
        if self._open == kind:
            return b""
        out = self._close_block()
        self._open = kind
        self._blocks += 1
        return out + sse({"type": "content_block_start", "index": self._blocks - 1, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse({"type": "content_block_delta", "index": self._blocks - 1, "delta": delta})

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return sse({"type": "content_block_stop", "index": self._blocks - 1})

    def _closing(self) -> bytes:
        self.ended = True
        reason, sequence = stop_reason(self._choice, self.stop_sequences, self._used_tools)
        usage = anthropic_usage(self._usage or {"prompt_tokens": self.prompt_tokens}, self.accounting)
        usage.pop("cache_creation", None)
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage}
        return self._close_block() + sse(delta) + sse({"type": "message_stop"})


class AnthropicEventStream(web.StreamResponse):
    """A streamed response that writes Anthropic events for the chat chunks written to it."""

    def __init__(self, translator: StreamTranslator, *, status: int, headers: dict[str, str]) -> None:
        super().__init__(status=status, headers=headers)
        self.translator = translator
        self._opened = False

    async def prepare(self, request: BaseRequest) -> AbstractStreamWriter | None:
        writer = await super().prepare(request)
        if not self._opened:
            self._opened = True
            await super().write(self.translator.opening())
        return writer

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        translated = self.translator.feed(bytes(data))
        if translated:
            await super().write(translated)
