"""The ``routing:`` section of config.yaml (hot-reloadable)."""

from typing import Literal

from pydantic import Field, field_validator

from gateway.config_section import ConfigSection
from gateway.routing.registry import POLICIES as POLICY_REGISTRY
from gateway.routing.registry import SCORERS as SCORER_REGISTRY

POLICIES = tuple(POLICY_REGISTRY)
SCORERS = tuple(SCORER_REGISTRY)


class LateBindingConfig(ConfigSection):
    """``routing.late_binding`` (gateway/routing/late_binding.py): hold a load spill for its owner.
    Off by default: it did not win across trace windows in ``bench simulate`` (bench/RESULTS.md)."""

    enabled: bool = False
    max_wait_s: float = Field(1.0, gt=0)
    """Longest a request waits for its owner before it is routed as if never held; an owner whose
    estimated TTFT is more than this above the spill's is not waited for at all."""


class DisaggregationConfig(ConfigSection):
    """``routing.disaggregation`` (gateway/routing/pd_decider.py): whether a request prefills on a
    prefill replica and decodes on another. It matters only in a fleet with ``role: prefill`` or
    ``role: decode`` backends, or with ``among_both``."""

    mode: Literal["conditional", "always", "never"] = "conditional"
    """conditional: per request, from the TTFT estimator (the decider's docstring); always: every
    request that has a prefill replica to go to (vLLM's P/D proxies); never: prefill locally."""
    kv_bytes_per_token: int = Field(46_080, ge=0)
    """KV bytes a prompt token moves: the model's, from ``kvgate plan`` (planner/kv_math.py).
    Default: SmolLM2-135M in float32 as the bundled engine holds it on CPU (30 layers x 3 KV heads
    x 64 x 2 x 4 bytes); Llama-3-8B in bf16 is 131,072."""
    kv_bandwidth_bytes_per_s: float = Field(2e9, gt=0)
    """Bandwidth of a KV pull from the prefill replica: 2 GB/s is TCP on one host or a 25 Gb/s
    link; NIXL over RDMA reaches 25-50 GB/s."""
    split_overhead_s: float = Field(0.005, ge=0)
    """Fixed cost a split adds to the first token: the prefill leg's round trip and the pull's setup."""
    itl_weight: float = Field(0.1, ge=0)
    """Seconds of TTFT one second of stall to other requests' decodes is worth: a prefill on a
    replica stalls each decode running there for its duration, but that stall spreads over the
    decode's output tokens (mean ITL), so it weighs less than a wait for a first token. In
    ``bench simulate-pd`` (Llama-3-8B on H100, 8 replicas, conversation window 0) 1.0 split too
    eagerly and lost to aggregated at trace time / 16 (48 vs 75 % goodput); 0.1 matched or beat it
    at / 8 and / 16 (bench/notes/2026-12-02-pd-simulate.md)."""
    among_both: bool = False
    """Disaggregate a model whose replicas are all ``both`` too: each request's prefill may run on
    another replica, the one where the split costs least (gateway/routing/pd_leg.py), without
    setting any replica apart for prefill. Every engine needs a KV connector (``kvgate up`` then
    starts its engines with one). Off: such a model runs as if P/D did not exist."""
    prefill_overflow_s: float | None = Field(None, gt=0)
    """A ``prefill`` replica takes client requests too while every replica that serves clients has
    more than this many seconds of prefill queued (the fleet is past capacity), so a mixed fleet
    keeps all its replicas decoding then (gateway/routing/prefill_overflow.py; 1.0 is the value
    measured). None: a ``prefill`` replica only ever takes prefill legs."""
    stall_free_tokens: int = Field(256, ge=0)
    """Uncached prompt tokens a prefill can run alongside decodes without stalling them (chunked
    prefill hides a chunk in a decode step): below it, a local prefill costs no one else's ITL, so
    a warm follow-up or a short prompt prefills where it decodes."""
    itl_target_s: float = Field(0.05, gt=0)
    """Mean inter-token latency a decode should keep. On a replica that serves both phases and
    reports its decodes (the bundled engine), a prefill's stall is priced by the decodes it pushes
    past this (gateway/routing/decode_slack.py), not by every decode it delays."""
    missed_itl_weight: float = Field(2.0, ge=0)
    """Seconds of TTFT one second of stall is worth for each decode that stall pushes past
    ``itl_target_s``. In ``bench simulate-pd`` (all-``both`` fleets) 1.0, 2.0 and 4.0 did alike
    on Llama-3-8B and within a point on Llama-3-70B TP4; 2.0 was the steadiest
    (bench/notes/2026-12-03-pd-decode-slack.md)."""


class RoutingConfig(ConfigSection):
    """How the router picks a replica. Defaults are the ones that won the benchmarks."""

    policy: str = "cache_aware"
    """One of POLICIES; each is a pipeline of weighted scorers (declared in gateway/routing/registry.py)."""
    scorers: dict[str, float] = {}
    """Override the policy's scorer weights ({scorer: weight}); a scorer not in the policy is added."""

    prefill_tokens_per_s: float = Field(650.0, gt=0)
    """Assumed prefill speed when no replica of the model reports its own (SmolLM2-135M on 2 CPU
    cores, and the simulated engine's default preset, prefill about 600-670 tokens/s)."""
    prefill_rate_spread: float = Field(0.25, ge=0)
    """A replica's measured prefill rate within this fraction of the mean of the candidates' is
    priced as that mean: the readings of like hardware differ with the recent mix of work (on an
    H100 preset by 5-10 %), and a replica that read a little faster took one request of a burst
    too many and queued a tier behind the rest (``bench simulate`` hotspot burst, 8 x H100: 31-34
    of 256 a replica read apart, 32 each priced alike). Replicas on other hardware differ by more
    and keep their own rate. 0: every replica its own rate."""
    decode_wait_s_per_request: float = Field(0.005, ge=0)
    """Queue wait each running request adds to a new request's first token (decode steps it shares)."""
    ttft_target_s: float = Field(5.0, gt=0)
    """cache_aware moves a request off the replica caching most of it (its owner) when that prefix
    is private to it (a conversation's earlier turns, not a shared prefix) only when the owner's
    estimated TTFT breaks this target by more than the move would spend recomputing the owner's
    cached prefix, and another replica's meets it; when every replica breaks it, only when another
    is faster by more than the target. A move recomputes the prefix and duplicates it in a second
    cache: on the trace windows every move off a busy owner at 1-3 s cost hit rate (up to 2.5
    points on synthetic 2800) and bought no p99 TTFT (``bench simulate``, bench/RESULTS.md), so
    this is a guard against an owner that truly cannot keep up, not a latency target."""
    shared_prefix_requests: float = Field(8.0, gt=0)
    """A prefix is shared (a system prompt, a few-shot preamble, a hot document) once this many
    requests ended their cached match on it within about ``shared_prefix_window_s`` (a count that
    fades continuously, so N requests in quick succession count a little under N); a request on
    a shared prefix goes where its estimated TTFT is lowest, cache credited, so a hot prefix is
    copied to replicas with room instead of queueing on its first holder. A conversation's next
    turn ends its match on the turn before, which only it matches. 8 and 16 routed every trace
    window alike in ``bench simulate`` (no trace prefix is that hot there); 3 lost skew 1.4 points."""
    spread_conversations: bool = True
    """A new conversation's first turn (its session key active on no replica, ``session_ttl_s``)
    that matches a cached prefix goes where its estimated TTFT plus one prefill of its own size per
    conversation already active there is lowest: its later turns will run where it lands and take
    turns with theirs, and whatever it matches, other sessions put there (so it is placed like a
    shared prefix, not held to an owner). Without it, in ``bench simulate --workload multi-turn``,
    the first holders of the system prompt drew most new conversations for the sake of one first
    token each (think times spread 0.25 s, seed 0: 26, 19, 15 and 4 of 64; with it 16 each) and
    their turns queued behind one another: TTFT p99 0.31 s against 0.04 s, hit rate level
    (bench/notes/2026-12-05-multi-turn-lock-step.md). Needs ``session_footprints``; requests without
    a session key are never charged."""
    shared_prefix_window_s: float = Field(10.0, gt=0)
    """Time constant of the shared-prefix counts: a count fades by e in this many seconds."""
    placement_slack_s: float = Field(0.1, ge=0)
    """A request with no useful match (a new prefix) goes, among the replicas whose estimated TTFT
    is within this of the fastest, to the one whose cache turns over slowest (the fewest new blocks
    sent to it lately, ``churn_window_s``): its least recently used blocks are then the oldest, so
    the prefix evicts what is least likely to come back (sglang-router places new prefixes on the
    replica with the smallest tree to the same end). 0: the fastest, always."""
    placement_slack_share: float = Field(0.1, ge=0)
    """The slack is also at most this share of the fastest estimate: a new prefix trades at most a
    tenth of its own TTFT for an older cache. On a GPU a long prompt prefills in a few hundred ms,
    where 0.1 s was a third of it and set the fleet's TTFT tail."""
    churn_window_s: float = Field(300.0, gt=0)
    """Time constant of the new-block counts that measure each replica's cache turnover: about
    the time a replica's cache takes to turn over once (131k tokens at the ~600 new tokens/s of
    the trace benchmarks: 220 s). In ``bench simulate`` 300 s was ahead of the sglang-router
    model on 20 of 25 trace windows, 60 s on 18, 10 s on 17 (bench/RESULTS.md)."""
    min_match_tokens: int = Field(64, ge=0)
    """A match that exceeds what every candidate holds by fewer tokens than this is no useful match:
    the request is placed by load alone (short prompts: ``short_prompt_match_share``)."""
    short_prompt_match_share: float = Field(0.5, ge=0, le=1)
    """A prompt shorter than ``min_match_tokens`` / this (128 tokens at the defaults) needs only this
    share of itself matched: otherwise no prompt under ``min_match_tokens`` could ever be routed to
    its cache, a short conversation's second turn included (sglang-router and llm-d route it there;
    on the synthetic trace, a fifth of whose prompts are under 128 tokens, that alone kept kvgate's
    hit rate a few tokens behind theirs, bench/notes/2026-12-04-short-prompt-matches.md). Such a
    match saves a few blocks, not a queue: its owner takes the request only within
    ``placement_slack_s`` of the fastest replica, and late binding never holds it. 0: every prompt
    needs ``min_match_tokens``."""
    min_match_fraction: float = Field(0.1, ge=0, le=1)
    """Nor is one that exceeds it by less than this share of the prompt. In a large fleet a hot
    root (the traces' shared 64 tokens) is held by only the few replicas that served it first, so
    every candidate holding least lacks it and the root alone would look like a match; requests
    matching only the root then stay on those few replicas, whose caches evict conversations
    while the rest stand empty. A share of the prompt scales with the prompt, unlike a token count.
    0.1 lifted the whole conversation trace from 33.2 % to 35.8 % on 32 replicas and to 37.6 % on
    64 (bound 37.8 %) in ``bench simulate``, and changed no 4-replica window or generated workload
    by more than 0.4 points (bench/RESULTS.md); 0.0 turns it off."""

    session_headers: list[str] = ["x-session-id"]
    """Request headers that name the client's session, first found wins; ``prompt_cache_key``,
    ``user`` and ``kvgate_session`` come after them (gateway/routing/cache_keys.py)."""
    infer_retention_keys: bool = True
    """A follow-up on a private prefix without a client session key carries a key inferred from its
    prefix (gateway/routing/retention_keys.py) as a retention hint to bundled engines, which then
    keep the conversation's latest turn past one-shot prompts."""

    session_footprints: bool = True
    """For requests with a client session key, count the KV blocks each replica's active sessions
    made it cache (gateway/routing/session_footprint.py): cache_aware then charges a replica the
    recompute that a session request's new blocks would force once those footprints exceed its KV
    capacity (``kv_capacity_blocks``, its reported ``num_blocks``, or ``default_capacity_blocks``),
    and the picker breaks ties toward the replica with the fewest active sessions, so new
    conversations go to replicas with room instead of piling onto one whose cache their growing
    histories then overflow. Multi-turn real runs: 86.63-86.64 % in three runs, against 84.0-86.6 %
    in seven without (bench/notes/2026-12-01-session-footprints-multi-turn-conversations-spread.md)."""
    session_ttl_s: float = Field(300.0, gt=0)
    """A session's footprint counts until its last turn is this old: the bundled engine's
    ``--session-ttl-s`` default, for which it keeps an active session's latest turn."""

    disaggregation: DisaggregationConfig = DisaggregationConfig()
    """Prefill/decode split per request (gateway/routing/pd_decider.py)."""
    late_binding: LateBindingConfig = LateBindingConfig()
    """Hold a request for its busy owner at the gateway instead of spilling it."""

    host_hit_cost: float = Field(0.15, ge=0, le=1)
    """Precise mode: what a prompt token found only in a replica's host KV tier costs, as a fraction
    of recomputing it (the copy back over PCIe). Arithmetic, not a measurement: Llama-3-8B holds
    128 KiB of bf16 KV per token, 5.2 us over a 25 GB/s link, against 16 GFLOP of prefill per
    token, 32 us at half an H100's 990 TFLOPS bf16 peak: about 0.15. (The bundled engine on CPU:
    1.8 us against 8.4 ms, about 0.0002.)"""
    speculative_ttl_s: float = Field(5.0, gt=0)
    """Precise mode: how long a routed request's blocks count as cached before its KV events arrive."""
    default_capacity_blocks: int | None = Field(None, ge=1)
    """Predicted mode: KV blocks a replica holds when neither the backend config nor the replica tells."""
    max_index_blocks: int = Field(2_000_000, ge=1)
    """Cap on blocks in the prefix index, all replicas together (about 150 bytes each)."""

    session_vnodes: int = Field(64, ge=1)
    """Points per replica on the session policy's consistent-hash ring."""
    random_seed: int | None = None
    """Seed for the random policy (None: seeded from the OS)."""

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, policy: str) -> str:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; choose one of {', '.join(POLICIES)}")
        return policy

    @field_validator("scorers")
    @classmethod
    def _known_scorers(cls, scorers: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(scorers) - set(SCORERS))
        if unknown:
            raise ValueError(f"unknown scorer(s) {', '.join(unknown)}; choose from {', '.join(SCORERS)}")
        if any(weight < 0 for weight in scorers.values()):
            raise ValueError("scorer weights must be >= 0")
        return scorers
