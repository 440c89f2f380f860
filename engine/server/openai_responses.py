"""OpenAI response bodies for completions and chat completions, whole and as stream chunks.

A finished choice's ``stop_reason`` is the stop string that ended it, as vLLM reports it (null
after EOS). A request with ``n`` samples has ``n`` choices; usage counts the prompt once and the output of
every choice. ``cached_tokens`` is the largest cache hit among the samples: the samples after
the first find the prompt's full blocks in the prefix cache, which is what vLLM reports for the
same request (its merged output carries the count of a sample scheduled after the first).
"""

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.llm_engine import RequestOutput
from engine.model.runner_api import TokenLogprobs
from engine.server.tool_choice import ToolMode
from engine.server.tool_parser import ToolCallStream, parse_answer

TokenText = Callable[[int], str]
"""The text of one token id, as logprobs name tokens."""


@dataclass
class Choice:
    """One sample's text and logprobs so far, and its last output (for counts and finish)."""

    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    last: RequestOutput | None = None

    def add(self, output: RequestOutput) -> None:
        self.text.append(output.text)
        if output.logprobs is not None:
            self.logprobs.append(output.logprobs)
        self.last = output


def usage(finals: list[RequestOutput]) -> dict[str, Any]:
    prompt_tokens = finals[0].num_prompt_tokens
    completion_tokens = sum(output.num_output_tokens for output in finals)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": max(output.num_cached_tokens for output in finals)},
    }


@dataclass
class ResponseShape:
    """How one endpoint names its objects and places generated text (and logprobs) in a choice."""

    model: str
    chat: bool
    token_text: TokenText
    want_logprobs: bool = False
    tools: ToolMode | None = None
    """A chat request's tools: its answers may carry ``tool_calls`` (``engine/server/tool_parser.py``)."""
    request_id: str = field(init=False)
    created: int = field(init=False)
    _text_offsets: dict[int, int] = field(init=False, default_factory=dict)
    _tool_streams: dict[int, ToolCallStream] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.request_id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def whole(self, choices: list[Choice]) -> dict[str, Any]:
        bodies = []
        for index, choice in enumerate(choices):
            assert choice.last is not None
            text = "".join(choice.text)
            logprobs = self._logprobs(index, choice.logprobs)
            finish = choice.last.finish_reason
            stop_reason = choice.last.stop_reason
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if self.tools is not None and finish == "stop":
                    content, calls = parse_answer(self.tools, text)
                    if calls:
                        message = {"role": "assistant", "content": content, "tool_calls": [c.body() for c in calls]}
                        finish = "tool_calls"
                body = {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
            else:
                body = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
            bodies.append(body | {"stop_reason": stop_reason})
        finals = [choice.last for choice in choices if choice.last is not None]
        return self._envelope("chat.completion" if self.chat else "text_completion", bodies, usage(finals))

    def chunks(self, output: RequestOutput, first: bool = False) -> list[dict[str, Any]]:
        """The stream chunks of one output: one, or for a chat with tools, one per content or tool-call delta."""
        if self.tools is None or not self.chat:
            return [self.chunk(output, first)]
        stream = self._tool_streams.setdefault(output.index, ToolCallStream(self.tools))
        deltas = stream.feed(output.text, output.finished)
        finish = output.finish_reason
        if finish == "stop" and stream.calls:
            finish = "tool_calls"
        if not deltas and not output.finished and output.logprobs is None:
            return []
        if output.finished or not deltas:
            deltas.append({})
        logprobs = self._logprobs(output.index, [output.logprobs] if output.logprobs else [])
        chunks = []
        for position, delta in enumerate(deltas):
            last = position == len(deltas) - 1
            if first and position == 0:
                delta = {"role": "assistant", **delta}
            choice = {
                "index": output.index,
                "delta": delta,
                "logprobs": logprobs if last else None,
                "finish_reason": finish if last and output.finished else None,
                "stop_reason": output.stop_reason if last else None,
            }
            chunks.append(self._envelope(self._chunk_object, [choice], None))
        return chunks

    def chunk(self, output: RequestOutput, first: bool = False) -> dict[str, Any]:
        """One stream chunk; a chat sample's ``first`` chunk also names the role, and carries the
        first token with it as vLLM's does, so a client's time to first chunk is its time to first token."""
        logprobs = self._logprobs(output.index, [output.logprobs] if output.logprobs else [])
        if self.chat:
            delta = {"role": "assistant", "content": output.text} if first else {"content": output.text}
            choice: dict[str, Any] = {"index": output.index, "delta": delta}
        else:
            choice = {"index": output.index, "text": output.text}
        choice |= {"logprobs": logprobs, "finish_reason": output.finish_reason, "stop_reason": output.stop_reason}
        return self._envelope(self._chunk_object, [choice], None)

    def usage_chunk(self, finals: list[RequestOutput]) -> dict[str, Any]:
        return self._envelope(self._chunk_object, [], usage(finals))

    def _logprobs(self, index: int, tokens: list[TokenLogprobs]) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        if self.chat:
            return {"content": [self._chat_entry(token) for token in tokens]}
        return self._completion_logprobs(index, tokens)

    def _chat_entry(self, token: TokenLogprobs) -> dict[str, Any]:
        entry = self._named(token.token_id, token.logprob)
        entry["top_logprobs"] = [self._named(token_id, logprob) for token_id, logprob in token.top]
        return entry

    def _named(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def _completion_logprobs(self, index: int, tokens: list[TokenLogprobs]) -> dict[str, Any]:
        texts = [self.token_text(token.token_id) for token in tokens]
        offsets = []
        offset = self._text_offsets.get(index, 0)
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        self._text_offsets[index] = offset
        return {
            "tokens": texts,
            "token_logprobs": [token.logprob for token in tokens],
            "top_logprobs": [
                {self.token_text(token_id): logprob for token_id, logprob in token.top} for token in tokens
            ],
            "text_offset": offsets,
        }

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
