"""What one request did, as every observer (metrics, stats, log) sees it."""

import time
from dataclasses import dataclass, field

UNAUTHENTICATED = "unauthenticated"
"""The tenant label of requests refused before their API key was known."""


@dataclass
class RequestRecord:
    request_id: str
    model: str | None
    tenant: str = UNAUTHENTICATED
    status: str = "200"
    """HTTP status, or `client_gone` / `incomplete` for a stream that did not finish."""
    error_code: str | None = None
    backend: str | None = None
    reason: str | None = None
    stream: bool = False
    prompt_tokens: int = 0
    predicted_cached_tokens: int = 0
    cached_tokens: int | None = None
    """Engine-reported `usage.prompt_tokens_details.cached_tokens`; None when the engine gave none."""
    completion_tokens: int | None = None
    retention: str | None = None
    """Whose session key named the request for retention hints: ``client``, ``inferred`` (the
    router's, for a follow-up turn: gateway/routing/retention_keys.py) or None."""
    charged_tokens: int | None = None
    """Tokens charged to the tenant's budget (gateway/dispatch.py: tokens_used); None when refused before."""
    over_cap_tokens: int = 0
    """Completion tokens past the granted cap (all samples): a backend that ignored max_tokens in an
    answer the gateway could not cut (not streamed). Charged to the tenant all the same."""
    queued_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    normalized_rules: list[str] = field(default_factory=list)
    trace_id: str | None = None
    """The W3C trace this request belongs to (the caller's `traceparent`, or one the gateway started)."""
    finished_at: float = field(default_factory=time.time)
    cost: float | None = None
    """At the model's ``observability.pricing`` (None: no price): what the request would be billed."""
    cache_savings: float | None = None
    """What its cached prompt tokens saved against the uncached input price."""
    pd: str | None = None
    """On a model with P/D roles: its prefill decision (gateway/pd_dispatch.py ``PdChoice``)."""
    prefill_backend: str | None = None
    """The replica its prefill leg went to (disaggregated, or a leg that failed)."""
    prefill_prompt_tokens: int | None = None
    prefill_cached_tokens: int | None = None
    """The prefill replica's own prefix hit; ``cached_tokens`` stays the decode answer's."""

    @property
    def rejected(self) -> bool:
        return self.backend is None

    @property
    def inter_token_s(self) -> float | None:
        """Mean time between output tokens of a stream: (e2e - ttft) / (completion tokens - 1)."""
        if not self.stream or self.ttft_s is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)

    def log_fields(self) -> dict:
        return {
            "ts": round(self.finished_at, 3),
            "request_id": self.request_id,
            "tenant": self.tenant,
            "model": self.model,
            "backend": self.backend,
            "reason": self.reason,
            "status": self.status,
            "error_code": self.error_code,
            "stream": self.stream,
            "prompt_tokens": self.prompt_tokens,
            "predicted_cached_tokens": self.predicted_cached_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "over_cap_tokens": self.over_cap_tokens,
            "charged_tokens": self.charged_tokens,
            "retention": self.retention,
            "queued_s": round(self.queued_s, 4),
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 4),
            "e2e_s": round(self.e2e_s, 4),
            "normalized": self.normalized_rules,
            "trace_id": self.trace_id,
            "cost": self.cost,
            "cache_savings": self.cache_savings,
            "pd": self.pd,
            "prefill_backend": self.prefill_backend,
            "prefill_cached_tokens": self.prefill_cached_tokens,
        }
