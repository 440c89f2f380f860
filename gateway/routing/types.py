"""What the request handler hands the router, and what it gets back."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RouteRequest:
    """One request, as routing sees it (after normalization, tokenization and hashing)."""

    request_id: str
    model: str
    block_hashes: list[int]
    prompt_tokens: int
    max_tokens: int
    session_key: str | None = None
    """The client's session, already scoped to its tenant (gateway/routing/retention_keys.py)."""
    session_source: str | None = None
    """Where the client named its session (gateway/routing/cache_keys.py), e.g. ``prompt_cache_key``."""
    cache_salt: str | None = None
    token_ids: list[int] = field(default_factory=list, repr=False)
    adapter: str | None = None
    """The LoRA adapter asked for: only replicas that serve it may take the request."""
    tenant: str | None = None
    """Who sent it: inferred retention keys are scoped to it."""


@dataclass(frozen=True)
class ReplicaState:
    """A snapshot of one backend replica's load and health, taken by the backend pool."""

    name: str
    model: str
    healthy: bool
    in_flight: int
    in_flight_prefill_tokens: int
    """Uncached prompt tokens of requests sent but not yet answered with a first token."""
    max_concurrency: int | None = None
    num_running: int | None = None
    """Running requests at the replica, from every gateway (its latest report, adjusted by this
    gateway's requests since; gateway/backends/load_view.py)."""
    num_waiting: int | None = None
    queued_prefill_tokens: int | None = None
    """Prompt tokens queued for prefill at the replica, from every gateway when it reports them."""
    kv_usage: float | None = None
    prefill_tokens_per_s: float | None = None


@dataclass(frozen=True)
class Hold:
    """Late binding (gateway/routing/late_binding.py): wait for ``owner`` instead of spilling."""

    owner: str
    uncached_tokens: int
    """Prompt tokens the owner would still compute: its line's order (fewest first)."""


@dataclass(frozen=True)
class RouteDecision:
    backend: str
    reason: str
    """Why: prefix-hit, load-spill, no-match, session, round-robin, least-loaded, random, retry."""
    predicted_cached_tokens: int
    ranked: list[str]
    """Every eligible replica, best first (``ranked[0] == backend``), for diagnostics; a retry routes
    again without the replicas that failed, so it sees load and cache as they are by then."""
    hold: Hold | None = None
    """Set when late binding is on and ``backend`` is a load spill worth waiting out: the caller
    holds the request for the owner and routes it again when the owner frees capacity."""
    retention_key: str | None = None
    """For a follow-up on a private prefix without a client session key: a key stable across the
    conversation's turns (gateway/routing/retention_keys.py), sent to bundled engines as a retention
    hint so its latest turn outlives one-shot prompts."""
