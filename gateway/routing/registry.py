"""Every routing policy and scorer, each declared once: a policy is its weighted scorers and the rule
that names its reason (as llm-d declares a scheduler plugin). The config validates names against these.

    cache_aware      estimated_ttft                              prefix-hit | load-spill | no-match
    prefix_affinity  prefix_affinity + least_loaded x 0.001      prefix-hit | no-match
    least_loaded     least_loaded                                least-loaded
    round_robin      round_robin                                 round-robin
    random           random                                      random
    session          session_affinity + estimated_ttft x 0.001   session (cache_aware's without a key)

``routing.scorers`` in the config re-weights these or adds scorers to them.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
from gateway.routing.types import RouteReason

TIE_BREAKER = 0.001
"""Weight of a secondary scorer that only decides between otherwise equal replicas."""

ReasonRule = Callable[[RouteContext, str], RouteReason]
"""Why the policy's choice (the replica named) was made."""


@dataclass(frozen=True)
class ScorerInputs:
    """What a scorer may need when it is built."""

    random_seed: int | None
    ring_for_model: Callable[[str], HashRing]


SCORERS: Mapping[str, Callable[[ScorerInputs], Scorer]] = {
    "estimated_ttft": lambda inputs: EstimatedTTFT(),
    "prefix_affinity": lambda inputs: PrefixAffinity(),
    "least_loaded": lambda inputs: LeastLoaded(),
    "round_robin": lambda inputs: RoundRobin(),
    "random": lambda inputs: RandomChoice(inputs.random_seed),
    "session_affinity": lambda inputs: SessionAffinity(inputs.ring_for_model),
}
"""Each scorer by its config name, and how to build it."""


def cache_aware_reason(ctx: RouteContext, chosen: str) -> RouteReason:
    if not ctx.has_useful_match:
        return RouteReason.NO_MATCH
    return RouteReason.PREFIX_HIT if ctx.cached.get(chosen, 0) == ctx.best_cached else RouteReason.LOAD_SPILL


def affinity_reason(ctx: RouteContext, chosen: str) -> RouteReason:
    return RouteReason.PREFIX_HIT if ctx.has_useful_match else RouteReason.NO_MATCH


def session_reason(ctx: RouteContext, chosen: str) -> RouteReason:
    return RouteReason.SESSION if ctx.request.session_key is not None else cache_aware_reason(ctx, chosen)


def always(reason: RouteReason) -> ReasonRule:
    """The rule of a policy whose every choice has the same reason."""
    return lambda ctx, chosen: reason


@dataclass(frozen=True)
class PolicySpec:
    """A policy as declared: its scorers (config names) with their default weights, and its reason rule."""

    weights: Mapping[str, float]
    reason: ReasonRule


POLICIES: Mapping[str, PolicySpec] = {
    "cache_aware": PolicySpec({"estimated_ttft": 1.0}, cache_aware_reason),
    "prefix_affinity": PolicySpec({"prefix_affinity": 1.0, "least_loaded": TIE_BREAKER}, affinity_reason),
    "least_loaded": PolicySpec({"least_loaded": 1.0}, always(RouteReason.LEAST_LOADED)),
    "round_robin": PolicySpec({"round_robin": 1.0}, always(RouteReason.ROUND_ROBIN)),
    "random": PolicySpec({"random": 1.0}, always(RouteReason.RANDOM)),
    "session": PolicySpec({"session_affinity": 1.0, "estimated_ttft": TIE_BREAKER}, session_reason),
}
"""Each policy by its config name (``routing.policy``), in the order the benchmarks list them."""
