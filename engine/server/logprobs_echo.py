"""``echo`` and ``prompt_logprobs`` on ``/v1/completions``: the prompt's text and token logprobs in a choice.

Two shapes, as vLLM answers them:

- ``echo`` with ``logprobs: N``: the choice's text starts with the prompt, and OpenAI's legacy
  ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``) start with the
  prompt's tokens, the first one's logprob and alternatives null. This is what lm-eval's
  ``local-completions`` loglikelihood reads (``max_tokens`` 0 or 1).
- vLLM's ``prompt_logprobs: K``: ``choices[i].prompt_logprobs`` lists, per prompt token, null for
  the first and otherwise ``{token id: {logprob, rank, decoded_token}}`` for the token itself and
  the ``K`` most likely ones.
"""

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from engine.model.runner_api import TokenLogprobs
from protocol.openai import CompletionRequest
from protocol.openai_errors import bad_request

TokenText = Callable[[int], str]


def check_scored_request(request: CompletionRequest, num_prompt_tokens: int, max_model_len: int) -> None:
    """400s for what a prompt-echoing or prompt-scoring completion cannot do here."""
    if request.stream:
        param = "echo" if request.echo else "prompt_logprobs"
        raise bad_request(
            f"{param} is not supported with stream; send it without stream", param, "unsupported_parameter"
        )
    if request.requested_max_tokens == 0 and not (request.echo or request.prompt_logprobs is not None):
        raise bad_request("max_tokens 0 needs echo or prompt_logprobs (nothing would be returned)", "max_tokens")
    if num_prompt_tokens > max_model_len:
        raise bad_request(
            f"prompt has {num_prompt_tokens} tokens; this engine's maximum context length is {max_model_len}",
            "prompt",
            "context_length_exceeded",
        )


def refuse_chat_scoring(request: BaseModel) -> None:
    """Chat completions score no prompt here: vLLM's ``prompt_logprobs`` there is a 400, not ignored."""
    if (request.model_extra or {}).get("prompt_logprobs") is not None:
        raise bad_request(
            "prompt_logprobs is served on /v1/completions only", "prompt_logprobs", "unsupported_parameter"
        )


def scored_top(request: CompletionRequest) -> int | None:
    """Alternatives per prompt token the request needs (None: it needs no prompt logprobs at all)."""
    wanted = [request.prompt_logprobs]
    if request.echo:
        wanted.append(request.logprobs)
    counts = [count for count in wanted if count is not None]
    return max(counts) if counts else None


@dataclass(frozen=True)
class PromptEcho:
    """One prompt's text, ids and (when computed) per-token logprobs, placed into completion choices."""

    request: CompletionRequest
    text: str
    token_ids: list[int]
    scored: list[TokenLogprobs | None] | None
    token_text: TokenText

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        """A whole completion response with the prompt echoed and scored in each choice (mutated and returned)."""
        for choice in body["choices"]:
            self._into(choice)
        return body

    def prompt_only(self, model: str) -> dict[str, Any]:
        """The response to ``max_tokens: 0``: no generated token, only the prompt's echo and scores."""
        choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
        if self.request.logprobs is not None:
            choice["logprobs"] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        choices = [self._into({**choice, "index": index}) for index in range(self.request.n)]
        num_prompt = len(self.token_ids)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": num_prompt,
                "completion_tokens": 0,
                "total_tokens": num_prompt,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }

    def _into(self, choice: dict[str, Any]) -> dict[str, Any]:
        if self.request.echo:
            choice["text"] = self.text + choice["text"]
            if choice["logprobs"] is not None:
                choice["logprobs"] = self._legacy(choice["logprobs"])
        if self.request.prompt_logprobs is not None:
            choice["prompt_logprobs"] = self._vllm(self.request.prompt_logprobs)
        return choice

    def _legacy(self, generated: dict[str, Any]) -> dict[str, Any]:
        """The prompt's tokens in OpenAI's legacy logprobs, followed by the generated ones'."""
        assert self.scored is not None, "echo with logprobs scores the prompt"
        top = self.request.logprobs or 0
        tokens = [self.token_text(token_id) for token_id in self.token_ids]
        offsets, offset = [], 0
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {
            "tokens": tokens + generated["tokens"],
            "token_logprobs": [None if s is None else s.logprob for s in self.scored] + generated["token_logprobs"],
            "top_logprobs": [None if s is None else self._top_texts(s, top) for s in self.scored]
            + generated["top_logprobs"],
            "text_offset": offsets + [len(self.text) + start for start in generated["text_offset"]],
        }

    def _top_texts(self, scored: TokenLogprobs, top: int) -> dict[str, float]:
        """The ``top`` best tokens by text, and the prompt's own token, as vLLM lists them."""
        named = {self.token_text(token_id): logprob for token_id, logprob in scored.top[:top]}
        named.setdefault(self.token_text(scored.token_id), scored.logprob)
        return named

    def _vllm(self, top: int) -> list[dict[str, dict[str, Any]] | None]:
        assert self.scored is not None, "prompt_logprobs scores the prompt"
        entries: list[dict[str, dict[str, Any]] | None] = []
        for scored in self.scored:
            if scored is None:
                entries.append(None)
                continue
            entry = {str(scored.token_id): self._vllm_logprob(scored.token_id, scored.logprob, scored.rank)}
            for rank, (token_id, logprob) in enumerate(scored.top[:top], start=1):
                entry.setdefault(str(token_id), self._vllm_logprob(token_id, logprob, rank))
            entries.append(entry)
        return entries

    def _vllm_logprob(self, token_id: int, logprob: float, rank: int | None) -> dict[str, Any]:
        return {"logprob": logprob, "rank": rank, "decoded_token": self.token_text(token_id)}


def prompt_text(request: CompletionRequest, token_ids: list[int], decode: Callable[[list[int]], str]) -> str:
    """The prompt as the client sent it: its text, or its token ids decoded."""
    prompt = request.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else decode(token_ids)
