"""A policy as it runs: filters, then weighted scorers, then a picker, then the reason why.

The policies and scorers themselves are declared in gateway/routing/registry.py.
"""

from collections.abc import Callable
from dataclasses import dataclass

from gateway.routing.config import RoutingConfig
from gateway.routing.context import RouteContext
from gateway.routing.hash_ring import HashRing
from gateway.routing.registry import POLICIES, SCORERS, ReasonRule, ScorerInputs
from gateway.routing.scorers import Scorer


@dataclass
class Policy:
    name: str
    scorers: list[tuple[Scorer, float]]
    reason: ReasonRule

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


def build_policy(config: RoutingConfig, ring_for_model: Callable[[str], HashRing]) -> Policy:
    """The configured policy's pipeline, with ``config.scorers`` weights applied on top."""
    spec = POLICIES[config.policy]
    inputs = ScorerInputs(config.random_seed, ring_for_model)
    weights = {**spec.weights, **config.scorers}
    return Policy(config.policy, [(SCORERS[name](inputs), weight) for name, weight in weights.items()], spec.reason)
