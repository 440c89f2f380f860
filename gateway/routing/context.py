"""What every scorer of one routing decision sees: the request, the replicas, their cached prefixes."""

from dataclasses import dataclass, field
from typing import Protocol

from gateway.routing.types import ReplicaState, RouteRequest


class ScoringSettings(Protocol):
    """The routing settings scorers read (``RoutingConfig`` is one): passed in, so the policy
    registry that the config validates names against never imports the config back."""

    @property
    def prefill_tokens_per_s(self) -> float: ...

    @property
    def prefill_rate_spread(self) -> float: ...

    @property
    def decode_wait_s_per_request(self) -> float: ...

    @property
    def ttft_target_s(self) -> float: ...

    @property
    def placement_slack_s(self) -> float: ...

    @property
    def placement_slack_share(self) -> float: ...

    @property
    def min_match_tokens(self) -> int: ...

    @property
    def min_match_fraction(self) -> float: ...

    @property
    def short_prompt_match_share(self) -> float: ...


def predicted_cached_tokens(
    matched_blocks: int, prompt_tokens: int, block_size: int, engine_block_size: int | None = None
) -> int:
    """Prompt tokens an engine will serve from cache given a matched prefix of gateway blocks.

    The engine hits whole blocks of its own size (vLLM on CPU: 128 tokens), and, like vLLM and
    the bundled engine, always computes at least the last prompt token, so a fully cached prompt
    whose length is a multiple of the block size hits one block less.
    """
    unit = engine_block_size or block_size
    max_hit = max(prompt_tokens - 1, 0) // unit * unit
    return min(matched_blocks * block_size, max_hit) // unit * unit


@dataclass
class RouteContext:
    request: RouteRequest
    replicas: list[ReplicaState]
    """Eligible replicas, sorted by name."""
    cached: dict[str, int]
    """Predicted cached prompt tokens per replica (absent: none)."""
    indexed_blocks: dict[str, int]
    """Blocks the index holds per replica: how full its cache is believed to be."""
    config: ScoringSettings
    shared_prefix: bool = False
    """The deepest cached block of the prompt is one many recent requests matched
    (``RoutingConfig.shared_prefix_requests``): a prefix worth copying, not a private one."""
    churn: dict[str, float] = field(default_factory=dict)
    """New blocks recently sent to each replica: how fast its cache turns over."""
    overflow_tokens: dict[str, int] = field(default_factory=dict)
    """Per replica, for a request with a session key: the prompt tokens its active sessions'
    footprints would exceed its KV capacity by with this request's new blocks added (absent: none)."""
    active_sessions: dict[str, int] = field(default_factory=dict)
    """Per replica, for a request with a session key: the active sessions it serves."""
    passed_prompts: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per replica, the queued prompts this request would be admitted ahead of, (tokens, how many):
    prompts held behind a prefix block being computed that this prompt does not share (absent: none)."""
    new_session: bool = False
    """The request's session key is active on no replica: this turn chooses where the conversation
    will run all its turns."""
    best_cached: int = field(init=False)
    """The most cached tokens any eligible replica has."""
    shared_cached: int = field(init=False)
    """Cached tokens every eligible replica has: that part of a match says nothing about where to go."""
    has_useful_match: bool = field(init=False)
    """Some replica holds at least ``min_match_tokens`` (and ``min_match_fraction`` of the prompt) more
    than the one holding least (llm-d normalises prefix scores across candidates the same way): a
    root every replica holds, such as a shared system prompt, does not make a one-shot prompt look
    like a hit. A short prompt needs only ``short_prompt_match_share`` of itself: it could never
    reach the bar, and a short conversation's second turn belongs where its first is cached."""
    short_prompt_match: bool = field(init=False)
    """The match is useful only because the prompt is short (``short_prompt_match_share``): it saves
    a few blocks, so it is worth at most ``placement_slack_s`` of TTFT and nobody waits for it."""
    assumed_prefill_rate: float = field(init=False)
    """Prefill tokens/s of a replica that has not measured its own, or whose reading is within
    ``prefill_rate_spread`` of it: the mean of those that have (replicas of one model usually run
    on like hardware), else the configured rate. Mixing a measured rate with a made-up one would
    starve or swamp the replica that measured first."""

    def __post_init__(self) -> None:
        held = [self.cached.get(replica.name, 0) for replica in self.replicas]
        self.best_cached = max(held, default=0)
        self.shared_cached = min(held, default=0)
        distinct = self.best_cached - self.shared_cached
        bar = max(self.config.min_match_tokens, self.config.min_match_fraction * self.request.prompt_tokens)
        needed = bar
        if self.config.short_prompt_match_share:
            needed = min(bar, max(self.config.short_prompt_match_share * self.request.prompt_tokens, 1.0))
        self.has_useful_match = distinct > 0 and distinct >= needed
        self.short_prompt_match = self.has_useful_match and distinct < bar
        measured = [replica.prefill_tokens_per_s for replica in self.replicas if replica.prefill_tokens_per_s]
        self.assumed_prefill_rate = sum(measured) / len(measured) if measured else self.config.prefill_tokens_per_s

    @property
    def useful_best_cached(self) -> int:
        return self.best_cached if self.has_useful_match else 0

    def useful_cached(self, name: str) -> int:
        """Cached tokens worth routing on: none at all when no replica has a useful match."""
        return self.cached.get(name, 0) if self.has_useful_match else 0

    def distinct_cached(self, name: str) -> int:
        """Cached tokens of this replica beyond what every candidate holds (0 without a useful match)."""
        return self.cached.get(name, 0) - self.shared_cached if self.has_useful_match else 0

    def is_owner(self, name: str) -> bool:
        """Holds the longest useful match: the replica whose cache a follow-up turn should reuse."""
        return self.has_useful_match and self.cached.get(name, 0) == self.best_cached

    def prefill_rate(self, replica: ReplicaState) -> float:
        measured = replica.prefill_tokens_per_s
        if not measured or abs(measured / self.assumed_prefill_rate - 1) <= self.config.prefill_rate_spread:
            return self.assumed_prefill_rate
        return measured

    def queue_wait_s(self, replica: ReplicaState) -> float:
        """Seconds before the replica starts on a new request: prefill queued ahead plus decode load."""
        requests = replica.in_flight
        if replica.num_running is not None:
            requests = max(requests, replica.num_running + (replica.num_waiting or 0))
        queued = replica.queued_prefill_tokens
        if queued is None:
            queued = replica.in_flight_prefill_tokens
        else:
            queued -= min(self.passed_tokens(replica.name), queued)
        prefill_s = queued / self.prefill_rate(replica)
        return prefill_s + requests * self.config.decode_wait_s_per_request

    def passed_tokens(self, name: str) -> int:
        """Queued prompt tokens this request is admitted ahead of at replica ``name``, less the delay
        it causes them: each prompt it passes then waits for this one's prefill, counted once per
        prompt passed. So passing pays for a request with little to compute (a cached follow-up on
        its owner), not for a new prompt that would hold a whole burst back."""
        tokens, requests = self.passed_prompts.get(name, (0, 0))
        if not tokens:
            return 0
        own = self.request.prompt_tokens - self.useful_cached(name)
        return max(tokens - requests * own, 0)

    def recompute_s(self, replica: ReplicaState) -> float:
        """Prefill this replica would spend on prompt tokens an owner has cached and it has not:
        the work a move off the owner throws away."""
        return (self.useful_best_cached - self.useful_cached(replica.name)) / self.prefill_rate(replica)

    def own_prefill_s(self, replica: ReplicaState) -> float:
        """Prefill of the prompt past its longest useful match, at this replica's rate: what this
        request itself adds wherever that match is cached."""
        return (self.request.prompt_tokens - self.useful_best_cached) / self.prefill_rate(replica)

    def overflow_s(self, replica: ReplicaState) -> float:
        """The prefill a session request sent here would later cost in evicted session blocks:
        each block past the replica's capacity is recomputed by some conversation's next turn."""
        return self.overflow_tokens.get(replica.name, 0) / self.prefill_rate(replica)

    def estimated_ttft_s(self, replica: ReplicaState) -> float:
        uncached = self.request.prompt_tokens - self.useful_cached(replica.name)
        return self.queue_wait_s(replica) + uncached / self.prefill_rate(replica)
