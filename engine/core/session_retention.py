"""Retention hints: the latest turn of each active session is evicted after one-shot blocks.

A request may carry ``kvgate_session`` (the gateway sends a key scoped to the client's tenant).
When a request of a session leaves the running batch, the hashes of its full blocks become that
session's latest turn and replace the previous turn's. A session is active while its latest
turn is younger than its TTL: ``ttl_s`` (``--session-ttl-s``), unless the request asked for its own
(``kvgate_session_ttl_s``, at most ``max_ttl_s``: ``--max-session-ttl-s``). Sessions of different
TTLs mix, so expiry follows a heap of deadlines, not last-seen order: a 24 h session seen before a
5 min one outlives it. The block manager evicts cached-free blocks that no active
session's latest turn holds first, and retained ones only when nothing else is left.

Bounded: at most ``max_blocks`` distinct hashes are retained, so a flood of sessions cannot pin
the cache. The bound is shared fairly between **namespaces**: the part of a session key before
its first ``:`` (the gateway's keys are ``<tenant namespace>:<digest>``; a key without ``:`` is in
the namespace ``""``). Past the bound, the least recently seen session of the namespace that
retains the most blocks loses its retention (the newest turn, when it is its namespace's only
session, keeps its leading blocks instead). So a namespace that retains no more than
``max_blocks / active namespaces`` never loses a session to another's: one tenant flooding
sessions pushes out its own, and with a single namespace this is plain least-recently-seen.
Sessions pushed out rejoin the one-shot queue at its new end, not its front: they may be as hot
as anything (a system prompt that every request of a session-keyed workload shares), and at the
front they went before older one-shots, which cost the shared-prefix benchmark 12.7 points of hit
rate (bench/RESULTS.md). The bound pushes out by last-seen order whatever the TTLs: a long TTL
buys time, not a larger share.
"""

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from radix.hashing import BlockHash

DEFAULT_SESSION_TTL_S = 300.0
DEFAULT_MAX_SESSION_TTL_S = 86400.0
DEFAULT_SESSION_RETAIN_FRACTION = 0.5
NAMESPACE_SEPARATOR = ":"
"""Ends a session key's namespace (the gateway writes the same, gateway/routing/retention_keys.py)."""


def namespace_of(session: str) -> str:
    """The namespace whose share of the bound ``session`` is retained in."""
    namespace, separator, _ = session.partition(NAMESPACE_SEPARATOR)
    return namespace if separator else ""


@dataclass(frozen=True)
class _Turn:
    """A session's latest turn: the hashes it retains until ``expires_at``."""

    hashes: tuple[BlockHash, ...]
    ttl_s: float
    expires_at: float


class SessionRetention:
    def __init__(
        self,
        max_blocks: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_ttl_s: float = DEFAULT_MAX_SESSION_TTL_S,
    ) -> None:
        self.max_blocks = max_blocks
        self.ttl_s = ttl_s
        self.max_ttl_s = max_ttl_s
        self._clock = clock
        self._turns: dict[str, _Turn] = {}
        """Session -> its latest turn, least recently seen first (each turn is re-inserted)."""
        self._deadlines: list[tuple[float, str]] = []
        """Heap of (expires at, session); an entry whose session has since been seen again (or dropped)
        no longer matches its turn's ``expires_at`` and is skipped."""
        self._refs: dict[BlockHash, int] = {}
        """How many sessions' latest turns hold each retained hash."""
        self._namespaces: dict[str, OrderedDict[str, None]] = {}
        """Namespace -> its sessions, least recently seen first."""
        self._held: dict[str, dict[BlockHash, int]] = {}
        """Namespace -> how many of its sessions' latest turns hold each hash (its share's use)."""

    @property
    def num_sessions(self) -> int:
        return len(self._turns)

    @property
    def num_retained(self) -> int:
        return len(self._refs)

    def retained_by(self, namespace: str) -> int:
        """Distinct hashes the namespace's sessions retain."""
        return len(self._held.get(namespace, ()))

    def is_retained(self, block_hash: BlockHash) -> bool:
        return block_hash in self._refs

    def ttl_for(self, requested_s: float | None) -> float:
        """The TTL a session gets when it asks for ``requested_s`` (None: the default)."""
        return self.ttl_s if requested_s is None else min(requested_s, self.max_ttl_s)

    def expires_at(self, session: str) -> float | None:
        """When the session's retention ends (None: it has none)."""
        turn = self._turns.get(session)
        return turn.expires_at if turn else None

    def record_turn(
        self, session: str, hashes: list[BlockHash], ttl_s: float | None = None
    ) -> tuple[list[BlockHash], list[BlockHash], list[BlockHash]]:
        """Make ``hashes`` the session's latest turn, retained for ``ttl_for(ttl_s)``.

        Returns (hashes no longer retained because they are stale: the session's previous turn or
        expired sessions; hashes no longer retained because the bound pushed their sessions out;
        newly retained hashes). The second kind may still be hot (a shared system prompt of a
        session seen a moment before): they must not jump the eviction queue.
        """
        stale = self._drop(session) if session in self._turns else []
        kept = tuple(hashes[: self.max_blocks])
        added = [block_hash for block_hash in kept if self._refs.get(block_hash, 0) == 0]
        self._add(session, kept, self.ttl_for(ttl_s))
        stale.extend(self.expire())
        pushed_out = self._make_room(session)
        newly = [block_hash for block_hash in added if block_hash in self._refs]
        return (
            [block_hash for block_hash in set(stale) if block_hash not in self._refs],
            [block_hash for block_hash in set(pushed_out) if block_hash not in self._refs],
            newly,
        )

    def expire(self) -> list[BlockHash]:
        """Drop sessions past their TTL; returns the hashes they no longer retain."""
        now = self._clock()
        released: list[BlockHash] = []
        while self._deadlines and self._deadlines[0][0] < now:
            expires_at, session = heapq.heappop(self._deadlines)
            turn = self._turns.get(session)
            if turn is not None and turn.expires_at == expires_at:
                released.extend(self._drop(session))
        return released

    def clear(self) -> None:
        self._turns.clear()
        self._deadlines.clear()
        self._refs.clear()
        self._namespaces.clear()
        self._held.clear()

    def assert_invariants(self) -> None:
        counts: dict[BlockHash, int] = {}
        held: dict[str, dict[BlockHash, int]] = {}
        for session, turn in self._turns.items():
            namespace = held.setdefault(namespace_of(session), {})
            for block_hash in turn.hashes:
                counts[block_hash] = counts.get(block_hash, 0) + 1
                namespace[block_hash] = namespace.get(block_hash, 0) + 1
        assert counts == self._refs, "retained hash counts disagree with the sessions' turns"
        assert held == self._held, "a namespace's hash counts disagree with its sessions' turns"
        sessions = {namespace: list(order) for namespace, order in self._namespaces.items()}
        by_turns: dict[str, list[str]] = {}
        for session in self._turns:
            by_turns.setdefault(namespace_of(session), []).append(session)
        assert sessions == by_turns, "a namespace's sessions disagree with the sessions' turns"
        deadlines = set(self._deadlines)
        for session, turn in self._turns.items():
            assert (turn.expires_at, session) in deadlines, "a session has no deadline in the heap"

    def _make_room(self, newest: str) -> list[BlockHash]:
        """Push sessions out, the largest namespace's least recently seen first, until the bound holds."""
        pushed_out: list[BlockHash] = []
        while len(self._refs) > self.max_blocks:
            largest = max(self._held, key=lambda namespace: len(self._held[namespace]))
            session = next(iter(self._namespaces[largest]))
            if session != newest:
                pushed_out.extend(self._drop(session))
                continue
            others = max((len(held) for namespace, held in self._held.items() if namespace != largest), default=0)
            excess = len(self._refs) - self.max_blocks
            cut = max(1, min(excess, len(self._held[largest]) - others))
            turn = self._turns[session]
            pushed_out.extend(self._drop(session))
            self._add(session, turn.hashes[: max(len(turn.hashes) - cut, 0)], turn.ttl_s)
        return pushed_out

    def _add(self, session: str, hashes: tuple[BlockHash, ...], ttl_s: float) -> None:
        namespace = namespace_of(session)
        held = self._held.setdefault(namespace, {})
        for block_hash in hashes:
            self._refs[block_hash] = self._refs.get(block_hash, 0) + 1
            held[block_hash] = held.get(block_hash, 0) + 1
        expires_at = self._clock() + ttl_s
        self._turns[session] = _Turn(hashes, ttl_s, expires_at)
        self._namespaces.setdefault(namespace, OrderedDict())[session] = None
        heapq.heappush(self._deadlines, (expires_at, session))
        if len(self._deadlines) > 2 * len(self._turns) + 64:
            self._deadlines = [(turn.expires_at, name) for name, turn in self._turns.items()]
            heapq.heapify(self._deadlines)

    def _drop(self, session: str) -> list[BlockHash]:
        """Forget the session; returns the hashes no session retains any more."""
        hashes = self._turns.pop(session).hashes
        namespace = namespace_of(session)
        sessions = self._namespaces[namespace]
        del sessions[session]
        held = self._held[namespace]
        released = []
        for block_hash in hashes:
            count = self._refs[block_hash] - 1
            if count:
                self._refs[block_hash] = count
            else:
                del self._refs[block_hash]
                released.append(block_hash)
            count = held[block_hash] - 1
            if count:
                held[block_hash] = count
            else:
                del held[block_hash]
        if not sessions:
            del self._namespaces[namespace]
            del self._held[namespace]
        return released
