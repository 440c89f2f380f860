"""Scorers: each rates every eligible replica in [0, 1], higher is better (llm-d's convention).

A policy is a weighted sum of scorers (declared in gateway/routing/registry.py); a new policy is a new
scorer or a new weighting, never an edit of the request handler.
"""

import random
from collections.abc import Callable
from typing import Protocol

from gateway.routing.context import RouteContext
from gateway.routing.hash_ring import HashRing

_EPSILON_S = 1e-3
"""Keeps cost ratios finite when the cheapest replica costs nothing (an idle replica's wait)."""
RESOLUTION_S = 0.01
"""Time estimates are rounded to this: closer replicas tie, and the picker's tie-breaks (more
of the prompt cached, then the emptier cache) decide instead of measurement noise."""
NEVER_S = 1e6
"""The cost of a replica the owner rule rules out: it scores about 0."""


class Scorer(Protocol):
    def score(self, ctx: RouteContext) -> list[float]:
        """One score per ``ctx.replicas``, in their order."""
        ...


def inverse_cost(seconds: list[float]) -> list[float]:
    """The cheapest scores 1, the others cheapest/cost, costs rounded to ``RESOLUTION_S``."""
    costs = [round(cost / RESOLUTION_S) * RESOLUTION_S for cost in seconds]
    cheapest = min(costs)
    return [(cheapest + _EPSILON_S) / (cost + _EPSILON_S) for cost in costs]


class EstimatedTTFT:
    """cache_aware: time to first token = queue wait + prefill of the tokens not cached there.

    - A new prefix (no useful match) goes to the fastest replica, or to one within
      ``placement_slack_s`` of it and ``placement_slack_share`` of its estimate: all of those tie,
      and the picker takes the one whose cache turns over slowest.
    - A short prompt's match (``ctx.short_prompt_match``: half of a prompt under 128 tokens) goes
      to its owner when the owner is within ``placement_slack_s`` of the fastest, else as a new
      prefix: it saves a few blocks, not a queue.
    - A shared prefix (``ctx.shared_prefix``) goes where its estimated TTFT is lowest, cache
      credited: a hot system prompt is copied to a replica with room rather than queueing on its
      first holder.
    - A new conversation's first turn (``ctx.new_session``: its session key active on no replica)
      is placed like a shared prefix, since whatever it matches other sessions put there, and
      also pays, on each replica, one prefill of its own size for every conversation already
      active there: its later turns will run where this one does and take turns with theirs, so
      conversations spread over the fleet rather than pile onto the first holders of their system
      prompt for the sake of one first token each.
    - A private prefix stays with its owner (the replica with the longest useful match): another
      replica competes only when the owner's estimate breaks ``ttft_target_s`` by more than the
      move would spend recomputing the prefix the owner holds and that replica lacks, and its own
      estimate meets the target. Moving a conversation's turn recomputes its history and
      duplicates it in a second cache, which pays only when the owner truly cannot keep up. When
      every replica breaks the target (overload), another replica wins only if it is faster by
      more than the target.
    - A request with a session key also pays, on a replica whose active sessions' footprints
      already fill its KV cache, the recompute its own new blocks would force there
      (``RouteContext.overflow_s``), so conversations spread before caches thrash.
    """

    def score(self, ctx: RouteContext) -> list[float]:
        estimates = [ctx.estimated_ttft_s(replica) + ctx.overflow_s(replica) for replica in ctx.replicas]
        if not ctx.has_useful_match:
            return _near_fastest(estimates, ctx.config.placement_slack_s, ctx.config.placement_slack_share)
        if ctx.short_prompt_match:
            return _owner_within_slack(ctx, estimates)
        if ctx.new_session:
            return inverse_cost(_with_conversations(ctx, estimates))
        if ctx.shared_prefix:
            return inverse_cost(estimates)
        target = ctx.config.ttft_target_s
        owner_s = min(
            estimate for replica, estimate in zip(ctx.replicas, estimates, strict=True) if ctx.is_owner(replica.name)
        )
        return inverse_cost(
            [
                estimate
                if ctx.is_owner(replica.name)
                else _mover_cost(estimate, owner_s, target, ctx.recompute_s(replica))
                for replica, estimate in zip(ctx.replicas, estimates, strict=True)
            ]
        )


def _with_conversations(ctx: RouteContext, estimates: list[float]) -> list[float]:
    """Each estimate plus one prefill of the request's own size per conversation active there."""
    return [
        estimate + ctx.active_sessions.get(replica.name, 0) * ctx.own_prefill_s(replica)
        for replica, estimate in zip(ctx.replicas, estimates, strict=True)
    ]


def _near_fastest(estimates: list[float], slack_s: float, slack_share: float) -> list[float]:
    """``inverse_cost``, except that every estimate within ``slack_s`` of the fastest, and within
    ``slack_share`` of the fastest estimate, scores 1."""
    fastest = min(estimates)
    slack = min(slack_s, slack_share * fastest)
    return [
        1.0 if estimate <= fastest + slack else score
        for estimate, score in zip(estimates, inverse_cost(estimates), strict=True)
    ]


def _owner_within_slack(ctx: RouteContext, estimates: list[float]) -> list[float]:
    """A short prompt's match: its owner scores 1 within ``placement_slack_s`` of the fastest estimate
    (the picker then prefers the owner among the replicas tied at 1); otherwise it is placed as a
    new prefix."""
    fastest = min(estimates)
    near = _near_fastest(estimates, ctx.config.placement_slack_s, ctx.config.placement_slack_share)
    return [
        1.0 if ctx.is_owner(replica.name) and estimate <= fastest + ctx.config.placement_slack_s else score
        for replica, estimate, score in zip(ctx.replicas, estimates, near, strict=True)
    ]


def _mover_cost(estimate_s: float, owner_s: float, target_s: float, recompute_s: float) -> float:
    """What a replica that is not the owner costs under the owner rule; ``recompute_s`` is the
    prefill it would spend on the part of the prompt the owner has cached and it has not."""
    if owner_s <= target_s + recompute_s:
        return NEVER_S
    if estimate_s <= target_s:
        return estimate_s
    return estimate_s + target_s


class PrefixAffinity:
    """Pure affinity, load ignored: each replica's match beyond what every candidate holds,
    normalised so the longest scores 1 (llm-d's prefix scorer); all 0 without a useful match."""

    def score(self, ctx: RouteContext) -> list[float]:
        best = ctx.best_cached - ctx.shared_cached
        if not ctx.has_useful_match:
            return [0.0] * len(ctx.replicas)
        return [ctx.distinct_cached(replica.name) / best for replica in ctx.replicas]


class LeastLoaded:
    """Shortest estimated queue wait."""

    def score(self, ctx: RouteContext) -> list[float]:
        return inverse_cost([ctx.queue_wait_s(replica) for replica in ctx.replicas])


class RoundRobin:
    """Each call starts one replica further along the name-sorted list."""

    def __init__(self) -> None:
        self._turn = 0

    def score(self, ctx: RouteContext) -> list[float]:
        count = len(ctx.replicas)
        first = self._turn % count
        self._turn += 1
        return [1.0 - ((position - first) % count) / count for position in range(count)]


class RandomChoice:
    def __init__(self, seed: int | None) -> None:
        self._rng = random.Random(seed)

    def score(self, ctx: RouteContext) -> list[float]:
        return [self._rng.random() for _ in ctx.replicas]


class SessionAffinity:
    """Sticky sessions: the ring owner of the request's session key scores 1, its fallbacks less.

    Requests without a session key score 0 everywhere, leaving the choice to the other scorers.
    """

    def __init__(self, ring_for_model: Callable[[str], HashRing]) -> None:
        self._ring_for_model = ring_for_model

    def score(self, ctx: RouteContext) -> list[float]:
        key = ctx.request.session_key
        if key is None:
            return [0.0] * len(ctx.replicas)
        order = self._ring_for_model(ctx.request.model).walk(key)
        eligible = {replica.name for replica in ctx.replicas}
        rank = {name: position for position, name in enumerate(name for name in order if name in eligible)}
        count = len(ctx.replicas)
        return [1.0 - rank.get(replica.name, count) / count for replica in ctx.replicas]
