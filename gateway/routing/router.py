"""The router: which replica serves a request, why, and how many of its prompt tokens are cached.

The request handler calls ``route`` (sync, a few tens of microseconds), which returns a
``RouteTicket``; it hands the ticket to ``on_routed`` when it sends the request and to
``on_finished`` when the replica has answered. The last two keep the cache model and the
calibration of its predictions current. The caller holds the ticket, so the router keeps nothing
per request: a ticket never sent (a placement not taken, a client that left in the queue) is
simply dropped.
"""

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gateway.routing.cache_keys import keyed_reason
from gateway.routing.cache_tracker import CacheTracker, IndexStats
from gateway.routing.calibration import Calibration, CalibrationStats
from gateway.routing.config import RoutingConfig
from gateway.routing.context import RouteContext, predicted_cached_tokens
from gateway.routing.decaying_counts import DecayingCounts
from gateway.routing.hash_ring import HashRing
from gateway.routing.late_binding import hold_for_owner
from gateway.routing.output_lengths import AnswerLengthStats, OutputLengths
from gateway.routing.policies import Policy, build_policy
from gateway.routing.replica_spec import ReplicaSpec, known_capacity
from gateway.routing.retention_keys import conversation_key, first_private_block
from gateway.routing.session_footprint import FootprintStats, SessionFootprints
from gateway.routing.types import ReplicaState, RouteDecision, RouteReason, RouteRequest
from radix.prefix_index import PrefixMatch

__all__ = ["ReplicaSpec", "RouteTicket", "Router"]

log = logging.getLogger(__name__)

MAX_COUNTED_PREFIXES = 65536
"""Prefixes whose recent requests the shared-prefix rule counts; the least recently matched go first."""
BRANCH_WINDOW_S = 300.0
"""Time constant of the match-end counts that find where conversations part (a system prompt's end)."""
BRANCH_REQUESTS = 1.5
"""A block at least this many recent requests' matches ended on is a branch point: more than one
request within about ``BRANCH_WINDOW_S * ln 2`` (a conversation's turn ends one match each)."""
MAX_COUNTED_REPLICAS = 4096
"""Replicas whose new blocks are counted (removed ones linger until pushed out)."""


@dataclass(eq=False)
class RouteTicket:
    """One routing decision, and what the router needs to settle it once the request is sent and
    answered. Each of ``on_routed`` and ``on_finished`` settles a ticket at most once; finishing a
    ticket that was never sent does nothing (nothing was predicted on its behalf)."""

    request: RouteRequest
    decision: RouteDecision
    matched_blocks: dict[str, int]
    """Per replica: the prompt's leading blocks the cache model says it holds."""
    cached: dict[str, int]
    """Per replica: the prompt tokens predicted cached there (what calibration compares)."""
    found: PrefixMatch
    """The index's match, which ``on_routed`` hands back to spare the insert its lookups."""
    sent_to: str | None = None
    """The replica ``on_routed`` was told the request went to."""
    finished: bool = False


@dataclass(frozen=True)
class RouterStats:
    """What the router knows, for metrics and the dashboard (serialised as is)."""

    policy: str
    index: IndexStats
    calibration: CalibrationStats
    sessions: dict[str, FootprintStats]
    """Per replica: the active sessions with a client key routed there, and their footprints."""
    answer_lengths: AnswerLengthStats


class Router:
    def __init__(
        self,
        config: RoutingConfig,
        block_size: int,
        replicas: list[ReplicaSpec],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` dates the cache model's entries (a virtual clock in ``kvgate bench simulate``)."""
        self.block_size = block_size
        self.config = config
        self.tracker = CacheTracker(config, block_size, replicas, clock)
        self._clock = clock
        self._prefix_requests: DecayingCounts[int] = DecayingCounts(config.shared_prefix_window_s, MAX_COUNTED_PREFIXES)
        """Per deepest cached block hash: the requests routed with their match ending there."""
        self._match_ends: DecayingCounts[int] = DecayingCounts(BRANCH_WINDOW_S, MAX_COUNTED_PREFIXES)
        """The same, fading over minutes: where conversations part, for inferred retention keys."""
        self._conversation_keys: OrderedDict[int, str] = OrderedDict()
        """Inferred retention keys by the last block of the prompt that got them: the block the
        conversation's next turn ends its match on, so a conversation is named once, not by a scan
        of its whole history every turn."""
        self._new_blocks: DecayingCounts[str] = DecayingCounts(config.churn_window_s, MAX_COUNTED_REPLICAS)
        """Per replica: blocks routed there that it did not hold (its cache's turnover)."""
        self._footprints = SessionFootprints(config.session_ttl_s)
        self.calibration = Calibration()
        self.output_lengths = OutputLengths()
        """Completed answers' lengths against their bounds (the P/D decider's guess of where decodes stop)."""
        self._rings: dict[str, HashRing] = {}
        self._replicas = list(replicas)
        self._specs = {spec.name: spec for spec in replicas}
        self.policy: Policy = build_policy(config, self._ring_for_model)

    async def start(self) -> None:
        self.tracker.start()

    async def stop(self) -> None:
        await self.tracker.stop()

    def route(self, request: RouteRequest, replicas: list[ReplicaState], may_hold: bool = True) -> RouteTicket:
        """Rank ``replicas``, which the caller has already filtered to those that may take the request
        (the backend pool's health, breaker and draining state, and a free slot).

        The decision comes in a ticket the caller hands to ``on_routed`` and ``on_finished``. With
        late binding on and ``may_hold``, a load spill worth waiting out comes back with
        ``decision.hold`` set (gateway/routing/late_binding.py)."""
        candidates = sorted(replicas, key=lambda replica: replica.name)
        matched, found = self.tracker.match_prefix(request.block_hashes)
        prompt = request.prompt_tokens
        cached = {
            name: predicted_cached_tokens(blocks, prompt, self.block_size, self.tracker.engine_block_size(name))
            for name, blocks in matched.items()
        }
        priced = self.tracker.priced_cached(request.block_hashes, matched, cached)
        index = self.tracker.index
        indexed = {replica.name: index.blocks(replica.name) for replica in candidates if replica.name in self._specs}
        now = self._clock()
        match_end = _match_end(request.block_hashes, matched)
        shared = match_end is not None and (
            self._prefix_requests.value(match_end, now) >= self.config.shared_prefix_requests
        )
        churn = {replica.name: self._new_blocks.value(replica.name, now) for replica in candidates}
        overflow, sessions = self._session_load(request, candidates, matched, now)
        passed = self._passed_prompts(request, candidates)
        new_session = self._starts_conversation(request, now)
        ctx = RouteContext(
            request, candidates, priced, indexed, self.config, shared, churn, overflow, sessions, passed, new_session
        )
        ranked = self.policy.rank(ctx)
        chosen = ranked[0]
        reason = self.policy.reason(ctx, chosen)
        late = self.config.late_binding
        hold = None
        if late.enabled and may_hold and reason == RouteReason.LOAD_SPILL:
            hold = hold_for_owner(ctx, chosen, late.max_wait_s)
        retention_key = None
        if (
            self.config.infer_retention_keys
            and reason == RouteReason.PREFIX_HIT
            and not shared
            and request.session_key is None
        ):
            held = [matched.get(replica.name, 0) for replica in candidates]
            retention_key = self._retention_key(request.block_hashes, held, match_end, now)
        reason = keyed_reason(reason, request.session_source)
        decision = RouteDecision(chosen, reason, cached.get(chosen, 0), ranked, hold, retention_key)
        return RouteTicket(request, decision, matched, cached, found)

    def _passed_prompts(self, request: RouteRequest, candidates: list[ReplicaState]) -> dict[str, tuple[int, int]]:
        """Per replica, the queued prompts held behind a prefix block being computed that ``request``
        does not share, (tokens, how many): the replica admits it ahead of them.

        Counting those prompts whole for everyone is what spreads a burst on one new prefix (its
        followers wait for the first to compute it, yet each adds its whole prompt to where it went);
        counted for a request that passes them, they made a follow-up leave its owner
        (bench/notes/2026-12-02-prefix-waits.md). Only where the replica's blocks are the gateway's
        (precise mode, one block size), so that a hash names the same prefix on both sides."""
        passed: dict[str, tuple[int, int]] = {}
        shared: set[int] | None = None
        for replica in candidates:
            waits = replica.prefix_waits
            if not waits or not self._hashes_blocks_as_we_do(replica.name):
                continue
            shared = set(request.block_hashes) if shared is None else shared
            held = [wait for block_hash, wait in waits.items() if block_hash not in shared]
            if held:
                passed[replica.name] = (sum(tokens for tokens, _ in held), sum(requests for _, requests in held))
        return passed

    def _hashes_blocks_as_we_do(self, name: str) -> bool:
        """The replica's block hashes are the gateway's: precise mode, one block size."""
        if name not in self._specs or not self.tracker.is_precise(name):
            return False
        return self.tracker.engine_block_size(name) == self.block_size

    def _retention_key(self, hashes: list[int], held: list[int], match_end: int | None, now: float) -> str | None:
        """The conversation's key: the one its previous turn got, else the first private block's.

        A key named by its first block (nothing common, no branch point seen yet: the first
        conversations on a new system prompt) is not remembered, so a later turn can still find the
        branch point once another conversation has parted there."""
        key = self._conversation_keys.get(match_end) if match_end is not None else None
        if key is None:
            index = first_private_block(hashes, held, lambda block: self._is_branch_point(block, now))
            if index is None:
                return None
            key = conversation_key(hashes[index])
            if not index:
                return key
        self._conversation_keys[hashes[-1]] = key
        self._conversation_keys.move_to_end(hashes[-1])
        if len(self._conversation_keys) > MAX_COUNTED_PREFIXES:
            self._conversation_keys.popitem(last=False)
        return key

    def _session_load(
        self, request: RouteRequest, candidates: list[ReplicaState], matched: dict[str, int], now: float
    ) -> tuple[dict[str, int], dict[str, int]]:
        """For a request with a session key, per candidate: the prompt tokens by which its active
        sessions' footprints plus this request's new blocks would exceed its KV capacity (known
        capacities only), and its active sessions. Empty without a key."""
        overflow: dict[str, int] = {}
        sessions: dict[str, int] = {}
        if request.session_key is None or not self.config.session_footprints:
            return overflow, sessions
        for replica in candidates:
            name = replica.name
            sessions[name] = self._footprints.sessions(name, now)
            spec = self._specs.get(name)
            capacity = known_capacity(spec, self.config.default_capacity_blocks) if spec is not None else None
            if capacity is not None:
                new_blocks = len(request.block_hashes) - matched.get(name, 0)
                excess = self._footprints.blocks(name, now) + new_blocks - capacity
                overflow[name] = max(excess, 0) * self.block_size
        return overflow, sessions

    def _starts_conversation(self, request: RouteRequest, now: float) -> bool:
        """The request's session key is active on no replica (with ``spread_conversations`` and
        ``session_footprints`` on): this turn places the whole conversation."""
        key = request.session_key
        if key is None or not (self.config.spread_conversations and self.config.session_footprints):
            return False
        return not self._footprints.is_active(key, now)

    def _is_branch_point(self, block_hash: int, now: float) -> bool:
        """More than one recent request's cached match ended on this block: conversations part here."""
        return self._match_ends.value(block_hash, now) >= BRANCH_REQUESTS

    def on_routed(self, ticket: RouteTicket, backend: str) -> None:
        """The request was sent to ``backend``: count it and insert its blocks there (once per ticket)."""
        if ticket.sent_to is not None:
            return
        ticket.sent_to = backend
        if backend not in self._specs:
            return
        request = ticket.request
        now = self._clock()
        match_end = _match_end(request.block_hashes, ticket.matched_blocks)
        if match_end is not None:
            self._prefix_requests.add(match_end, 1.0, now)
            self._match_ends.add(match_end, 1.0, now)
        held = ticket.matched_blocks.get(backend, 0)
        self._new_blocks.add(backend, len(request.block_hashes) - held, now)
        if request.session_key is not None:
            self._footprints.add(backend, request.session_key, len(request.block_hashes), held, now)
        self.tracker.record_routed(request.block_hashes, backend, ticket.found)

    def on_finished(
        self,
        ticket: RouteTicket,
        reported_cached_tokens: int | None,
        prefilled: bool,
        completed_output_tokens: int | None = None,
    ) -> None:
        """The request the ticket was sent with has ended, ``prefilled`` on its replica (which then
        holds its blocks, however the answer ended) or not: calibrate the prediction, or undo the
        blocks it was predicted to hold (once per ticket). ``completed_output_tokens``: the answer's
        length when the replica finished it (not a client gone or an error)."""
        backend = ticket.sent_to
        if backend is None or ticket.finished:
            return
        ticket.finished = True
        if completed_output_tokens is not None:
            self.output_lengths.record(completed_output_tokens, ticket.request.max_tokens)
        if backend not in self._specs:
            return
        if not prefilled:
            self.tracker.record_failed(ticket.request.block_hashes, backend, ticket.matched_blocks.get(backend, 0))
        elif reported_cached_tokens is not None:
            self.calibration.add(ticket.cached.get(backend, 0), reported_cached_tokens)

    def on_served_elsewhere(self, ticket: RouteTicket, backend: str) -> None:
        """The request was served, prompt prefilled, by ``backend`` rather than where the ticket
        sent it (the data plane's fallback): its blocks are there now (predicted mode)."""
        if backend in self._specs:
            self.tracker.record_routed(ticket.request.block_hashes, backend, None)

    def on_restarted(self, replica: str) -> None:
        """The replica restarted with an empty KV cache: forget what it held, and its sessions'
        footprints there."""
        self.tracker.record_restart(replica)
        self._footprints.remove_replica(replica)

    def update(self, config: RoutingConfig, replicas: list[ReplicaSpec]) -> None:
        """Hot reload: a new policy or weights, replicas added or removed."""
        if _policy_fields(config) != _policy_fields(self.config):
            log.info("routing policy is now %s", config.policy)
            self.policy = build_policy(config, self._ring_for_model)
        if config.session_vnodes != self.config.session_vnodes or replicas != self._replicas:
            self._rings.clear()
        self.config = config
        self._prefix_requests.time_constant_s = config.shared_prefix_window_s
        self._new_blocks.time_constant_s = config.churn_window_s
        self._footprints.ttl_s = config.session_ttl_s
        for name in self._specs.keys() - {spec.name for spec in replicas}:
            self._footprints.remove_replica(name)
        self._replicas = list(replicas)
        self._specs = {spec.name: spec for spec in replicas}
        self.tracker.update(config, replicas)

    @property
    def replicas(self) -> list[ReplicaSpec]:
        return list(self._replicas)

    def stats(self) -> RouterStats:
        footprints = self._footprints.stats(self._clock())
        return RouterStats(
            self.policy.name, self.tracker.stats(), self.calibration.summary(), footprints, self.output_lengths.stats()
        )

    def _ring_for_model(self, model: str) -> HashRing:
        ring = self._rings.get(model)
        if ring is None:
            names = [spec.name for spec in self._replicas if spec.model == model]
            ring = self._rings[model] = HashRing(names, self.config.session_vnodes)
        return ring


def _match_end(hashes: list[int], matched: dict[str, int]) -> int | None:
    """The hash of the deepest block any replica holds (None: no replica holds any): the prefix a
    request's cached match ends on, which the shared-prefix rule counts."""
    deepest = max(matched.values(), default=0)
    return hashes[deepest - 1] if deepest else None


def _policy_fields(config: RoutingConfig) -> tuple[object, ...]:
    """The settings a policy's scorers are built from (the others are read per request)."""
    return config.policy, config.scorers, config.random_seed
