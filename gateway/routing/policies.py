"""Policies as pipelines: filters, then weighted scorers, then a picker, then the reason why.

    cache_aware      estimated_ttft                         prefix-hit | load-spill | no-match
    prefix_affinity  prefix_affinity + least_loaded x 0.001 prefix-hit | no-match
    least_loaded     least_loaded                           least-loaded
    round_robin      round_robin                            round-robin
    random           random                                 random
    session          session_affinity + estimated_ttft x 0.001   session (cache_aware's without a key)

``routing.scorers`` in the config re-weights these or adds scorers to them.
"""

from collections.abc import Callable
from dataclasses import dataclass

from gateway.routing.config import RoutingConfig
from gateway.routing.context import RouteContext
from gateway.routing.hash_ring import HashRing
from gateway.routing.scorers import (
    EstimatedTTFT,
    LeastLoaded,
    PrefixAffinity,
    RandomChoice,
    RoundRobin,
    Scorer,
    SessionAffinity,
)

TIE_BREAKER = 0.001
"""Weight of a secondary scorer that only decides between otherwise equal replicas."""


def cache_aware_reason(ctx: RouteContext, chosen: str) -> str:
    if not ctx.has_useful_match:
        return "no-match"
    return "prefix-hit" if ctx.cached.get(chosen, 0) == ctx.best_cached else "load-spill"


def affinity_reason(ctx: RouteContext, chosen: str) -> str:
    return "prefix-hit" if ctx.has_useful_match else "no-match"


def session_reason(ctx: RouteContext, chosen: str) -> str:
    return "session" if ctx.request.session_key is not None else cache_aware_reason(ctx, chosen)


@dataclass
class Policy:
    name: str
    scorers: list[tuple[Scorer, float]]
    reason: Callable[[RouteContext, str], str]

    def rank(self, ctx: RouteContext) -> list[str]:
        """Eligible replicas best first: highest weighted score, then more of the prompt cached,
        then fewer active sessions (a session request: conversations spread before their histories
        grow), then the cache that turns over slowest, then the emptier cache (new prefixes spread
        out), then name."""
        totals = [0.0] * len(ctx.replicas)
        for scorer, weight in self.scorers:
            if weight:
                totals = [total + weight * score for total, score in zip(totals, scorer.score(ctx), strict=False)]
        order = sorted(
            range(len(ctx.replicas)),
            key=lambda i: (
                -round(totals[i], 9),
                -ctx.distinct_cached(ctx.replicas[i].name),
                ctx.active_sessions.get(ctx.replicas[i].name, 0),
                ctx.churn.get(ctx.replicas[i].name, 0.0),
                ctx.indexed_blocks.get(ctx.replicas[i].name, 0),
                ctx.replicas[i].name,
            ),
        )
        return [ctx.replicas[i].name for i in order]


_DEFAULT_WEIGHTS: dict[str, dict[str, float]] = {
    "cache_aware": {"estimated_ttft": 1.0},
    "prefix_affinity": {"prefix_affinity": 1.0, "least_loaded": TIE_BREAKER},
    "least_loaded": {"least_loaded": 1.0},
    "round_robin": {"round_robin": 1.0},
    "random": {"random": 1.0},
    "session": {"session_affinity": 1.0, "estimated_ttft": TIE_BREAKER},
}

_REASONS: dict[str, Callable[[RouteContext, str], str]] = {
    "cache_aware": cache_aware_reason,
    "prefix_affinity": affinity_reason,
    "least_loaded": lambda ctx, chosen: "least-loaded",
    "round_robin": lambda ctx, chosen: "round-robin",
    "random": lambda ctx, chosen: "random",
    "session": session_reason,
}


def build_policy(config: RoutingConfig, ring_for_model: Callable[[str], HashRing]) -> Policy:
    """The configured policy's pipeline, with ``config.scorers`` weights applied on top."""
    factories: dict[str, Callable[[], Scorer]] = {
        "estimated_ttft": EstimatedTTFT,
        "prefix_affinity": PrefixAffinity,
        "least_loaded": LeastLoaded,
        "round_robin": RoundRobin,
        "random": lambda: RandomChoice(config.random_seed),
        "session_affinity": lambda: SessionAffinity(ring_for_model),
    }
    weights = {**_DEFAULT_WEIGHTS[config.policy], **config.scorers}
    return Policy(
        config.policy,
        [(factories[name](), weight) for name, weight in weights.items()],
        _REASONS[config.policy],
    )
