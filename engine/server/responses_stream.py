"""A generation's outputs as the Responses API's stream events, as OpenAI sends them.

``response.created`` and ``response.in_progress`` open the stream. Each output item is opened by
``response.output_item.added`` and closed by ``response.output_item.done``: a message between
them gets ``response.content_part.added``, ``response.output_text.delta`` ... ``.done`` and
``response.content_part.done``; a function call gets ``response.function_call_arguments.delta``
... ``.done``. ``response.completed`` (or ``response.incomplete`` at the token limit) ends it, with
every item. Without tools the message opens at once; with tools, items open as the answer shows
what it is (chat's ``ToolCallStream`` turns text into content and call deltas).
"""

from dataclasses import dataclass
from typing import Any

from engine.core.llm_engine import RequestOutput
from engine.server.responses_api import ResponseBuilder, function_call_item, item_id, message_item, text_part
from engine.server.tool_parser import ToolCallStream

Event = dict[str, Any]


@dataclass
class _OpenItem:
    """The output item being streamed: its body as first announced, and its text or arguments so far."""

    item: dict[str, Any]
    index: int
    text: str = ""


class ResponseStream:
    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        tools = builder.tools
        self._calls = ToolCallStream(tools) if tools is not None and tools.kind != "none" else None
        self._done: list[dict[str, Any]] = []
        self._open: _OpenItem | None = None

    def opening(self) -> list[Event]:
        started = self.builder.response(None, None)
        events = [
            self.builder.event("response.created", response=started),
            self.builder.event("response.in_progress", response=started),
        ]
        return events + (self._open_message() if self._calls is None else [])

    def feed(self, output: RequestOutput) -> list[Event]:
        """The events of one output; the last output also closes the open item and the response."""
        if self._calls is not None:
            deltas = self._calls.feed(output.text, output.finished)
        else:
            deltas = [{"content": output.text}] if output.text else []
        events: list[Event] = []
        for delta in deltas:
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls", []):
                function = call["function"]
                if "id" in call:
                    events += self._close() + self._open_call(call["id"], function["name"])
                if function.get("arguments"):
                    events += self._arguments(function["arguments"])
        if output.finished:
            events += self._close()
            if not self._done:
                events += self._open_message() + self._close()
            closing = self.builder.response(self._done, output)
            events.append(self.builder.event(f"response.{closing['status']}", response=closing))
        return events

    def _open_message(self) -> list[Event]:
        self._open = _OpenItem(message_item(item_id("msg"), None, "in_progress"), len(self._done))
        return [
            self.builder.event("response.output_item.added", output_index=self._open.index, item=self._open.item),
            self.builder.event("response.content_part.added", **self._part_place(), part=text_part("")),
        ]

    def _open_call(self, call_id: str, name: str) -> list[Event]:
        item = function_call_item(item_id("fc"), call_id, name, "", "in_progress")
        self._open = _OpenItem(item, len(self._done))
        return [self.builder.event("response.output_item.added", output_index=self._open.index, item=item)]

    def _text(self, text: str) -> list[Event]:
        if self._open is None or self._open.item["type"] != "message":
            return self._close() + self._open_message() + self._text(text)
        self._open.text += text
        return [self.builder.event("response.output_text.delta", **self._part_place(), delta=text)]

    def _arguments(self, text: str) -> list[Event]:
        assert self._open is not None and self._open.item["type"] == "function_call"
        self._open.text += text
        place = {"item_id": self._open.item["id"], "output_index": self._open.index}
        return [self.builder.event("response.function_call_arguments.delta", **place, delta=text)]

    def _close(self) -> list[Event]:
        """The events that finish the open item (none if no item is open)."""
        item, self._open = self._open, None
        if item is None:
            return []
        place = {"item_id": item.item["id"], "output_index": item.index}
        if item.item["type"] == "message":
            done = message_item(item.item["id"], item.text, "completed")
            events = [
                self.builder.event("response.output_text.done", **place, content_index=0, text=item.text),
                self.builder.event("response.content_part.done", **place, content_index=0, part=text_part(item.text)),
            ]
        else:
            done = {**item.item, "arguments": item.text, "status": "completed"}
            events = [
                self.builder.event(
                    "response.function_call_arguments.done", **place, name=done["name"], arguments=item.text
                )
            ]
        self._done.append(done)
        return [*events, self.builder.event("response.output_item.done", output_index=item.index, item=done)]

    def _part_place(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open.item["id"], "output_index": self._open.index, "content_index": 0}
