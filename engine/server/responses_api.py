"""OpenAI Responses API bodies (``/v1/responses``): text or function calls out, whole and streamed.

Responses are not stored: each is built from one generation and forgotten, so
``previous_response_id`` is refused (see ``protocol.openai.responses_messages``). An answer is a
list of output items: a ``message`` with its text, and, when the request has tools and the answer
calls them, ``function_call`` items (``call_id``, ``name``, ``arguments``), read back from the text
by chat's tool parser (``engine/server/tool_parser.py``). The stream is built in ``engine/server/responses_stream.py``.
"""

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine.core.llm_engine import RequestOutput
from engine.server.tool_choice import ToolMode
from engine.server.tool_parser import ToolCall, parse_answer
from protocol.openai import ResponsesRequest


def response_usage(final: RequestOutput) -> dict[str, Any]:
    return {
        "input_tokens": final.num_prompt_tokens,
        "input_tokens_details": {"cached_tokens": final.num_cached_tokens},
        "output_tokens": final.num_output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": final.num_prompt_tokens + final.num_output_tokens,
    }


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def message_item(identifier: str, text: str | None, status: str) -> dict[str, Any]:
    """A message item; one in progress has no content yet (its part is added by an event)."""
    content = [text_part(text or "")] if status == "completed" else []
    return {"type": "message", "id": identifier, "status": status, "role": "assistant", "content": content}


def function_call_item(identifier: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": identifier,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


@dataclass
class ResponseBuilder:
    """One response's ids and settings; builds its object, its output items and its events."""

    model: str
    request: ResponsesRequest
    tools: ToolMode | None = None
    """The request's tools: its answer may carry ``function_call`` items."""
    response_id: str = field(default_factory=lambda: item_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    _sequence: int = 0

    def response(self, output: list[dict[str, Any]] | None, final: RequestOutput | None) -> dict[str, Any]:
        """The response object: in progress (``final`` None) or finished with its ``output`` items."""
        status = "in_progress"
        incomplete = None
        if final is not None:
            status = "incomplete" if final.finish_reason == "length" else "completed"
            incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        request = self.request
        text_format = request.text.format if request.text is not None else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "model": self.model,
            "output": output or [],
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": None,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "tool_choice": request.tool_choice or "auto",
            "tools": request.tools or [],
            "text": {
                "format": text_format.model_dump(by_alias=True, exclude_none=True) if text_format else {"type": "text"}
            },
            "truncation": "disabled",
            "usage": None if final is None else response_usage(final),
            "user": request.user,
            "metadata": {},
        }

    def output_items(self, text: str, final: RequestOutput) -> list[dict[str, Any]]:
        """A whole answer's items: its message, or the function calls it made (after any text before them)."""
        if self.tools is not None and final.finish_reason == "stop":
            content, calls = parse_answer(self.tools, text)
            if calls:
                before = [message_item(item_id("msg"), content, "completed")] if content else []
                return before + [self.call_item(call) for call in calls]
        return [message_item(item_id("msg"), text, "completed")]

    @staticmethod
    def call_item(call: ToolCall) -> dict[str, Any]:
        return function_call_item(item_id("fc"), call.id, call.name, call.arguments, "completed")

    def event(self, event_type: str, **fields: Any) -> dict[str, Any]:
        """The next stream event (each numbered in order)."""
        event = {"type": event_type, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event
