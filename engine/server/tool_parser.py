"""Tool calls read back from generated text, whole or as OpenAI stream deltas.

``auto`` answers are parsed in the Hermes format the prompt asks for (``normalize/tool_prompt.py``,
vLLM's ``--tool-call-parser hermes``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
text before the first call is the content. A named choice's output is the arguments themselves, a
``required`` one's a single ``{"name": ..., "arguments": ...}`` object (``engine/server/tool_choice.py``).

Streamed, a call's first delta carries its ``id``, ``type`` and ``name`` (arguments ``""``), the next
ones pieces of ``arguments``; concatenated they equal the whole answer's call.
"""

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine.server.tool_choice import ToolMode

CALL_OPEN = "<tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_REQUIRED_HEAD = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')

Delta = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_answer(mode: ToolMode, text: str) -> tuple[str | None, list[ToolCall]]:
    """The content and calls of a finished answer (no calls: the text is all content)."""
    if mode.kind == "named":
        assert mode.named is not None
        return None, [ToolCall(call_id(), mode.named, text)]
    if mode.kind == "required":
        head = _REQUIRED_HEAD.match(text)
        if head is None or not text.endswith("}"):
            return text, []
        return None, [ToolCall(call_id(), json.loads(head.group(1)), text[head.end() : -1])]
    if mode.kind == "auto":
        return _parse_hermes(mode, text)
    return text, []


def _parse_hermes(mode: ToolMode, text: str) -> tuple[str | None, list[ToolCall]]:
    start = text.find(CALL_OPEN)
    if start < 0:
        return text, []
    calls = []
    for match in _HERMES_CALL.finditer(text, start):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            return text, []
        if not isinstance(call, dict) or call.get("name") not in mode.functions:
            return text, []
        arguments = call.get("arguments", {})
        calls.append(ToolCall(call_id(), call["name"], json.dumps(arguments, ensure_ascii=False)))
    content = text[:start].strip()
    return content or None, calls if mode.parallel else calls[:1]


@dataclass
class ToolCallStream:
    """One choice's stream: turns text deltas into content and tool-call deltas."""

    mode: ToolMode
    _buffer: str = ""
    _started: bool = False
    _in_call: bool = False
    calls: int = field(default=0)
    """Tool calls announced so far (a finish with calls reports ``tool_calls``)."""

    def feed(self, text: str, finished: bool) -> list[Delta]:
        if self.mode.kind == "named":
            return self._named(text)
        if self.mode.kind == "required":
            return self._required(text, finished)
        if self.mode.kind == "auto":
            return self._auto(text, finished)
        return [{"content": text}] if text else []

    def _named(self, text: str) -> list[Delta]:
        deltas = []
        if not self._started:
            self._started = True
            assert self.mode.named is not None
            deltas.append(_call_head(self.mode.named))
            self.calls = 1
        if text:
            deltas.append(_arguments(text))
        return deltas

    def _required(self, text: str, finished: bool) -> list[Delta]:
        self._buffer += text
        deltas = []
        if not self._started:
            head = _REQUIRED_HEAD.match(self._buffer)
            if head is None:
                return []
            self._started = True
            self.calls = 1
            deltas.append(_call_head(json.loads(head.group(1))))
            self._buffer = self._buffer[head.end() :]
        keep = 0 if finished else 1
        ready = self._buffer[: len(self._buffer) - keep] if len(self._buffer) > keep else ""
        self._buffer = self._buffer[len(ready) :]
        if finished and ready.endswith("}"):
            ready = ready[:-1]
        if ready:
            deltas.append(_arguments(ready))
        return deltas

    def _auto(self, text: str, finished: bool) -> list[Delta]:
        """Content streams as it comes, but for a tail that may open a call; a call is sent whole at the end."""
        self._buffer += text
        deltas: list[Delta] = []
        if not self._in_call:
            start = self._buffer.find(CALL_OPEN)
            self._in_call = start >= 0
            cut = start if self._in_call else len(self._buffer) - (0 if finished else _partial_open(self._buffer))
            content, self._buffer = self._buffer[:cut], self._buffer[cut:]
            if content:
                deltas.append({"content": content})
        if not (self._in_call and finished):
            return deltas
        _, calls = _parse_hermes(self.mode, self._buffer)
        if not calls:
            return [*deltas, {"content": self._buffer}]
        for call in calls:
            deltas += [_call_head(call.name, self.calls, call.id), _arguments(call.arguments, self.calls)]
            self.calls += 1
        return deltas


def _partial_open(text: str) -> int:
    """How many trailing characters of ``text`` could begin ``<tool_call>``."""
    for length in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-length:]):
            return length
    return 0


def _call_head(name: str, index: int = 0, identifier: str | None = None) -> Delta:
    head = {"index": index, "id": identifier or call_id(), "type": "function"}
    return {"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}


def _arguments(text: str, index: int = 0) -> Delta:
    return {"tool_calls": [{"index": index, "function": {"arguments": text}}]}
