"""Per-request token caps: a bound checked before tokenization, the exact check after it."""

from collections.abc import Callable
from dataclasses import dataclass

from gateway.admission.config import LimitsConfig, TokenCaps
from gateway.errors import bad_request

MERGED_CAPS_KEPT = 1024


@dataclass(frozen=True)
class TokenGrant:
    """What a request may generate: the cap the backend is told, the KV reserved and the tokens charged."""

    max_tokens: int


@dataclass(frozen=True)
class PromptBound:
    """A request's prompt-length limit, checked before tokenization (``RequestCaps.prompt_bound``)."""

    model: str
    limit: int | None

    def check(self, at_least: int) -> None:
        """Reject (400) a prompt whose lower bound on tokens cannot fit."""
        if self.limit is not None and at_least > self.limit:
            raise bad_request(
                f"This request has at least {at_least} prompt tokens; the limit for '{self.model}' is {self.limit}.",
                param="messages",
                code="prompt_too_long",
            )


class RequestCaps:
    """Caps from `limits:` (all models, per model), narrowed per tenant, and the model's context."""

    def __init__(self, limits: LimitsConfig, reported_context: Callable[[str], int | None]) -> None:
        self.limits = limits
        self.reported_context = reported_context
        """The smallest `max_model_len` the model's replicas report, or None."""
        self._merged: dict[tuple[int, str], tuple[TokenCaps, TokenCaps]] = {}
        """(tenant caps, merged caps) by (id of the tenant caps, model): merging pydantic models costs
        ~50 us a request. A reload builds a new RequestCaps, so nothing here goes stale."""

    def prompt_bound(self, model: str, tenant_caps: TokenCaps) -> PromptBound:
        """The most prompt tokens a request could be admitted with: ``max_prompt_tokens``, and one
        less than the context; no limit when neither is known. Computed once per request."""
        caps = self._caps(model, tenant_caps)
        context = caps.context_length or self.reported_context(model)
        bounds = [bound for bound in (caps.max_prompt_tokens, None if context is None else context - 1) if bound]
        return PromptBound(model, min(bounds) if bounds else None)

    def check(
        self, model: str, tenant_caps: TokenCaps, prompt_tokens: int, requested: int | None, default: int, n: int = 1
    ) -> TokenGrant:
        """Reject (400) or clamp; ``default`` is what a request without max_tokens is assumed to need;
        ``n`` samples over ``max_n`` are a 400 (never clamped: the client counts the choices)."""
        caps = self._caps(model, tenant_caps)
        if caps.max_n is not None and n > caps.max_n:
            raise bad_request(
                f"This request asks for {n} samples (n, or best_of on completions); the limit for '{model}' is "
                f"{caps.max_n}.",
                param="n",
                code="n_too_large",
            )
        _check_prompt_cap(caps, model, prompt_tokens, "prompt", "messages")
        context = caps.context_length or self.reported_context(model)
        if context is not None and prompt_tokens >= context:
            raise _context_exceeded(model, context, prompt_tokens, None)
        room = None if context is None else context - prompt_tokens
        grant = self._grant(caps, requested, default, room)
        if requested is not None and context is not None and grant.max_tokens > context - prompt_tokens:
            raise _context_exceeded(model, context, prompt_tokens, grant.max_tokens)
        return grant

    def _caps(self, model: str, tenant_caps: TokenCaps) -> TokenCaps:
        key = (id(tenant_caps), model)
        cached = self._merged.get(key)
        if cached is None or cached[0] is not tenant_caps:
            if len(self._merged) >= MERGED_CAPS_KEPT:
                self._merged.clear()
            cached = (tenant_caps, tenant_caps.over(self.limits.caps_for(model)))
            self._merged[key] = cached
        return cached[1]

    def check_prompt(self, model: str, tenant_caps: TokenCaps, prompt_tokens: int, longest_input: int) -> None:
        """The prompt caps alone, for requests that generate nothing (embeddings): 400 when over."""
        caps = self._caps(model, tenant_caps)
        _check_prompt_cap(caps, model, prompt_tokens, "input", "input")
        if caps.max_embedding_input_tokens is not None and prompt_tokens > caps.max_embedding_input_tokens:
            raise bad_request(
                f"This request has {prompt_tokens} input tokens in all; the limit for '{model}' is "
                f"{caps.max_embedding_input_tokens} per request.",
                param="input",
                code="too_many_input_tokens",
            )
        context = caps.context_length or self.reported_context(model)
        if context is not None and longest_input > context:
            raise bad_request(
                f"This model's maximum context length is {context} tokens; an input has {longest_input}.",
                param="input",
                code="context_length_exceeded",
            )

    @staticmethod
    def _grant(caps: TokenCaps, requested: int | None, default: int, room: int | None) -> TokenGrant:
        cap = caps.max_tokens
        if requested is None:
            return TokenGrant(min(value for value in (cap or default, room) if value is not None))
        if cap is None or requested <= cap:
            return TokenGrant(requested)
        if caps.max_tokens_policy == "clamp":
            return TokenGrant(cap)
        raise bad_request(
            f"max_tokens is {requested}; the limit is {cap}.", param="max_tokens", code="max_tokens_too_large"
        )


def _context_exceeded(model: str, context: int, prompt_tokens: int, max_tokens: int | None) -> Exception:
    if max_tokens is None:
        detail = f"your messages resulted in {prompt_tokens} tokens, which leaves no room for a completion"
    else:
        detail = f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion)"
    return bad_request(
        f"This model's maximum context length is {context} tokens. However, {detail}. "
        "Please reduce the length of the messages or completion.",
        param="messages",
        code="context_length_exceeded",
    )


def _check_prompt_cap(caps: TokenCaps, model: str, prompt_tokens: int, noun: str, param: str) -> None:
    """400 ``prompt_too_long`` when ``prompt_tokens`` is over the model's prompt cap."""
    if caps.max_prompt_tokens is not None and prompt_tokens > caps.max_prompt_tokens:
        raise bad_request(
            f"This request has {prompt_tokens} {noun} tokens; the limit for '{model}' is {caps.max_prompt_tokens}.",
            param=param,
            code="prompt_too_long",
        )
