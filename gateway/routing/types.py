"""What the request handler hands the router, and what it gets back."""

from dataclasses import dataclass, field
from enum import StrEnum

from protocol.replica_stats import DecodeProgress

CACHE_KEY_SUFFIX = "+cache-key"
"""Marks the route reason of a request whose session is its ``prompt_cache_key``."""


class RouteReason(StrEnum):
    """Why a request went where it did: the ``x-kvgate-route-reason`` header, the logs and the metrics' label.

    String-valued, so every one of those reads exactly the text it always did; a routing reason
    has a ``+cache-key`` form for a request whose session came from ``prompt_cache_key``.
    """

    PREFIX_HIT = "prefix-hit"
    LOAD_SPILL = "load-spill"
    NO_MATCH = "no-match"
    SESSION = "session"
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    RANDOM = "random"
    RETRY = "retry"
    PREFIX_HIT_BY_CACHE_KEY = "prefix-hit+cache-key"
    LOAD_SPILL_BY_CACHE_KEY = "load-spill+cache-key"
    NO_MATCH_BY_CACHE_KEY = "no-match+cache-key"
    SESSION_BY_CACHE_KEY = "session+cache-key"
    ROUND_ROBIN_BY_CACHE_KEY = "round-robin+cache-key"
    LEAST_LOADED_BY_CACHE_KEY = "least-loaded+cache-key"
    RANDOM_BY_CACHE_KEY = "random+cache-key"

    def by_cache_key(self) -> "RouteReason":
        """This reason, marked as routed on a ``prompt_cache_key`` session."""
        return RouteReason(self.value + CACHE_KEY_SUFFIX)


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
    prefix_waits: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Of those, the prompts held behind a prefix block the replica is computing, per that block's
    hash: (their tokens, how many). A request that shares none of those blocks is admitted ahead of them."""
    kv_usage: float | None = None
    prefill_tokens_per_s: float | None = None
    decodes: tuple[DecodeProgress, ...] | None = None
    """Each decode's progress (requests running or queued), from the replica's latest fresh report; None where it does
    not report them (vLLM) or no fresh report has come (gateway/routing/decode_slack.py)."""


@dataclass(frozen=True)
class Hold:
    """Late binding (gateway/routing/late_binding.py): wait for ``owner`` instead of spilling."""

    owner: str
    uncached_tokens: int
    """Prompt tokens the owner would still compute: its line's order (fewest first)."""


@dataclass(frozen=True)
class RouteDecision:
    backend: str
    reason: RouteReason | str
    """kvgate's router always gives a ``RouteReason``; only the simulator's peer models
    (bench/sim/simulate.py: direct round robin, sglang-router's) name their own."""
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
