"""Retention hints: the latest turn of each active session is evicted after one-shot blocks.

A request may carry ``kvgate_session`` (the gateway forwards the client's session key). When a
request of a session leaves the running batch, the hashes of its full blocks become that
session's latest turn and replace the previous turn's. A session is active while its latest
turn is younger than ``ttl_s``. The block manager evicts cached-free blocks that no active
session's latest turn holds first, and retained ones only when nothing else is left.

Bounded: at most ``max_blocks`` distinct hashes are retained; past that the least recently seen
sessions lose their retention (a turn longer than the bound keeps its leading blocks), so a
flood of sessions cannot pin the cache. Their blocks rejoin the one-shot queue at its new end,
not its front: they may be as hot as anything (a system prompt that every request of a
session-keyed workload shares), and at the front they went before older one-shots, which cost
the shared-prefix benchmark 12.7 points of hit rate (bench/RESULTS.md).
"""

import time
from collections import OrderedDict
from collections.abc import Callable

from radix.hashing import BlockHash

DEFAULT_SESSION_TTL_S = 300.0
DEFAULT_SESSION_RETAIN_FRACTION = 0.5


class SessionRetention:
    def __init__(self, max_blocks: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_blocks = max_blocks
        self.ttl_s = ttl_s
        self._clock = clock
        self._turns: OrderedDict[str, tuple[float, tuple[BlockHash, ...]]] = OrderedDict()
        """Session -> (last seen, hashes of its latest turn), least recently seen first."""
        self._refs: dict[BlockHash, int] = {}
        """How many sessions' latest turns hold each retained hash."""

    @property
    def num_sessions(self) -> int:
        return len(self._turns)

    @property
    def num_retained(self) -> int:
        return len(self._refs)

    def is_retained(self, block_hash: BlockHash) -> bool:
        return block_hash in self._refs

    def record_turn(
        self, session: str, hashes: list[BlockHash]
    ) -> tuple[list[BlockHash], list[BlockHash], list[BlockHash]]:
        """Make ``hashes`` the session's latest turn.

        Returns (hashes no longer retained because they are stale: the session's previous turn or
        expired sessions; hashes no longer retained because the bound pushed their sessions out;
        newly retained hashes). The second kind may still be hot (a shared system prompt of a
        session seen a moment before): they must not jump the eviction queue.
        """
        stale: list[BlockHash] = []
        old = self._turns.pop(session, None)
        if old is not None:
            stale.extend(self._unref(old[1]))
        kept = tuple(hashes[: self.max_blocks])
        added = [block_hash for block_hash in kept if self._refs.get(block_hash, 0) == 0]
        for block_hash in kept:
            self._refs[block_hash] = self._refs.get(block_hash, 0) + 1
        self._turns[session] = (self._clock(), kept)
        stale.extend(self.expire())
        pushed_out: list[BlockHash] = []
        while len(self._refs) > self.max_blocks and len(self._turns) > 1:
            _, (_, oldest) = self._turns.popitem(last=False)
            pushed_out.extend(self._unref(oldest))
        newly = [block_hash for block_hash in added if block_hash in self._refs]
        return (
            [block_hash for block_hash in set(stale) if block_hash not in self._refs],
            [block_hash for block_hash in set(pushed_out) if block_hash not in self._refs],
            newly,
        )

    def expire(self) -> list[BlockHash]:
        """Drop sessions not seen for ``ttl_s``; returns the hashes they no longer retain."""
        cutoff = self._clock() - self.ttl_s
        released: list[BlockHash] = []
        while self._turns:
            session, (seen, hashes) = next(iter(self._turns.items()))
            if seen >= cutoff:
                break
            del self._turns[session]
            released.extend(self._unref(hashes))
        return released

    def clear(self) -> None:
        self._turns.clear()
        self._refs.clear()

    def assert_invariants(self) -> None:
        counts: dict[BlockHash, int] = {}
        for _, hashes in self._turns.values():
            for block_hash in hashes:
                counts[block_hash] = counts.get(block_hash, 0) + 1
        assert counts == self._refs, "retained hash counts disagree with the sessions' turns"

    def _unref(self, hashes: tuple[BlockHash, ...]) -> list[BlockHash]:
        released = []
        for block_hash in hashes:
            count = self._refs[block_hash] - 1
            if count:
                self._refs[block_hash] = count
            else:
                del self._refs[block_hash]
                released.append(block_hash)
        return released
