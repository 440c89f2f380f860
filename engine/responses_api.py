"""OpenAI Responses API bodies (``/v1/responses``) for text in and text out, whole and streamed.

Responses are not stored: each is built from one generation and forgotten, so
``previous_response_id`` is refused (see ``protocol.openai.responses_messages``). A stream is
the Responses event sequence (``response.created`` ... ``response.completed``), each event an
SSE ``event:`` line plus its JSON, without the chat stream's ``[DONE]``.
"""

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine.llm_engine import RequestOutput
from protocol.openai import ResponsesRequest


def response_usage(final: RequestOutput) -> dict[str, Any]:
    return {
        "input_tokens": final.num_prompt_tokens,
        "input_tokens_details": {"cached_tokens": final.num_cached_tokens},
        "output_tokens": final.num_output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": final.num_prompt_tokens + final.num_output_tokens,
    }


@dataclass
class ResponseBuilder:
    """One response's ids and settings; builds its object and its stream events."""

    model: str
    request: ResponsesRequest
    response_id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))
    _sequence: int = 0

    def response(self, text: str | None, final: RequestOutput | None) -> dict[str, Any]:
        """The response object: in progress (``final`` None) or finished with ``text``."""
        status = "in_progress"
        incomplete = None
        if final is not None:
            status = "incomplete" if final.finish_reason == "length" else "completed"
            incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": self.request.instructions,
            "max_output_tokens": self.request.max_output_tokens,
            "model": self.model,
            "output": [] if final is None else [self.message(text or "", "completed")],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "temperature": self.request.temperature,
            "top_p": self.request.top_p,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": None if final is None else response_usage(final),
            "user": self.request.user,
            "metadata": {},
        }

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [self.text_part(text)] if status == "completed" else []
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    @staticmethod
    def text_part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": []}

    def opening_events(self) -> list[dict[str, Any]]:
        started = self.response(None, None)
        return [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
            self._event("response.output_item.added", output_index=0, item=self.message("", "in_progress")),
            self._event("response.content_part.added", **self._part_place(), part=self.text_part("")),
        ]

    def delta_event(self, delta: str) -> dict[str, Any]:
        return self._event("response.output_text.delta", **self._part_place(), delta=delta)

    def closing_events(self, text: str, final: RequestOutput) -> list[dict[str, Any]]:
        """The last events; the final one is ``response.completed``, or ``response.incomplete`` at the token limit."""
        closing = self.response(text, final)
        return [
            self._event("response.output_text.done", **self._part_place(), text=text),
            self._event("response.content_part.done", **self._part_place(), part=self.text_part(text)),
            self._event("response.output_item.done", output_index=0, item=self.message(text, "completed")),
            self._event(f"response.{closing['status']}", response=closing),
        ]

    def _part_place(self) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": 0, "content_index": 0}

    def _event(self, event_type: str, **fields: Any) -> dict[str, Any]:
        event = {"type": event_type, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event
