"""OpenAI response bodies for completions and chat completions, whole and as stream chunks."""

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine.llm_engine import RequestOutput


def usage(output: RequestOutput) -> dict[str, Any]:
    return {
        "prompt_tokens": output.num_prompt_tokens,
        "completion_tokens": output.num_output_tokens,
        "total_tokens": output.num_prompt_tokens + output.num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": output.num_cached_tokens},
    }


@dataclass
class ResponseShape:
    """How one endpoint names its objects and places generated text in a choice."""

    model: str
    chat: bool
    request_id: str = field(init=False)
    created: int = field(init=False)

    def __post_init__(self) -> None:
        self.request_id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def whole(self, text: str, final: RequestOutput) -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": final.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": final.finish_reason}
        return self._envelope("chat.completion" if self.chat else "text_completion", [choice], usage(final))

    def chunk(self, text: str, finish_reason: str | None, first: bool = False) -> dict[str, Any]:
        """One stream chunk; a chat's ``first`` chunk also names the role, and carries the first
        token with it as vLLM's does, so a client's time to first chunk is its time to first token."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope(self._chunk_object, [choice], None)

    def usage_chunk(self, final: RequestOutput) -> dict[str, Any]:
        return self._envelope(self._chunk_object, [], usage(final))

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _envelope(
        self, object_name: str, choices: list[dict[str, Any]], usage_body: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_body,
        }
