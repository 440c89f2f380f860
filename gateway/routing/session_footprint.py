"""Session footprints: the KV blocks that each replica's active sessions have made it cache.

A conversation's turns resend its whole history, so its footprint at a replica only grows: each
turn adds the blocks the replica did not hold. A turn that does not continue the session's last
one there (independent questions under one ``user``) replaces it instead, as the bundled engine's
retention does: only the latest turn is kept. A replica whose active sessions' footprints exceed
its KV capacity cannot keep them all, and every block it evicts is recomputed by the session's
next turn. The router charges a session request that recompute where its footprint would overflow
(gateway/routing/context.py, ``RouteContext.overflow_s``), which is how new conversations spread to
replicas with room before their caches thrash, not after.

A session is active while its last turn is younger than ``ttl_s``: the bundled engine retains an
active session's latest turn for the same time (``--session-ttl-s``), so the two agree on which
sessions still hold blocks. Each gateway counts the sessions it routed.
"""

from collections import OrderedDict
from dataclasses import dataclass

MAX_SESSIONS = 65536
"""Sessions counted per replica; past this, the least recently seen are forgotten."""


@dataclass(frozen=True)
class FootprintStats:
    """One replica's active sessions and the blocks their turns added there (metrics, dashboard)."""

    sessions: int
    blocks: int


class SessionFootprints:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._sessions: dict[str, OrderedDict[str, tuple[float, int, int]]] = {}
        """Per replica: session -> (last seen, blocks its turns added there, blocks of its last prompt),
        least recently seen first."""
        self._totals: dict[str, int] = {}

    def blocks(self, replica: str, now: float) -> int:
        """Blocks that the replica's active sessions have added to its cache."""
        self._expire(replica, now)
        return self._totals.get(replica, 0)

    def sessions(self, replica: str, now: float) -> int:
        """Active sessions whose turns went to the replica."""
        self._expire(replica, now)
        return len(self._sessions.get(replica, ()))

    def is_active(self, session: str, now: float) -> bool:
        """Some replica serves the session: a turn of it is younger than ``ttl_s``."""
        for replica, sessions in self._sessions.items():
            self._expire(replica, now)
            if session in sessions:
                return True
        return False

    def add(self, replica: str, session: str, prompt_blocks: int, held_blocks: int, now: float) -> None:
        """A turn of ``session`` was sent to ``replica``, which held ``held_blocks`` of its prompt's
        ``prompt_blocks``; the turn continues the session's last one there if it held all of that."""
        sessions = self._sessions.setdefault(replica, OrderedDict())
        _, before, last_prompt = sessions.pop(session, (now, 0, 0))
        kept = before if held_blocks >= last_prompt else 0
        blocks = kept + prompt_blocks - held_blocks
        sessions[session] = (now, blocks, prompt_blocks)
        self._totals[replica] = self._totals.get(replica, 0) + blocks - before
        if len(sessions) > MAX_SESSIONS:
            self._forget(replica, sessions)

    def stats(self, now: float) -> dict[str, FootprintStats]:
        return {
            replica: FootprintStats(self.sessions(replica, now), self.blocks(replica, now))
            for replica in self._sessions
        }

    def remove_replica(self, replica: str) -> None:
        self._sessions.pop(replica, None)
        self._totals.pop(replica, None)

    def _expire(self, replica: str, now: float) -> None:
        sessions = self._sessions.get(replica)
        while sessions and now - next(iter(sessions.values()))[0] >= self.ttl_s:
            self._forget(replica, sessions)

    def _forget(self, replica: str, sessions: OrderedDict[str, tuple[float, int, int]]) -> None:
        _, (_, blocks, _) = sessions.popitem(last=False)
        self._totals[replica] -= blocks
