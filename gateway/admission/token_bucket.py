"""A token bucket holding one minute's worth of tokens: a tenant's tokens- or requests-per-minute budget."""

import time
from collections.abc import Callable


class TokenBucket:
    """Refills continuously at ``per_minute / 60`` tokens a second, up to ``per_minute``."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._level = float(per_minute)
        self._updated = self._clock()

    def wait_s(self, tokens: int) -> float:
        """0 when ``tokens`` may be taken now, else the seconds until they would fit.

        More than a whole minute's budget fits a full bucket (and leaves it in debt); requests that
        large are refused before they get here (``Tenant.check_within_budget``).
        """
        self._refill()
        needed = min(tokens, self.per_minute)
        if self._level >= needed:
            return 0.0
        return (needed - self._level) * 60.0 / self.per_minute

    def take(self, tokens: int) -> None:
        """Take ``tokens`` (after ``wait_s`` said they fit)."""
        self._refill()
        self._level -= tokens

    def try_take(self, tokens: int) -> float:
        """Take ``tokens`` and return 0, or take nothing and return the seconds until they would fit."""
        wait_s = self.wait_s(tokens)
        if wait_s == 0.0:
            self.take(tokens)
        return wait_s

    def give_back(self, tokens: int) -> None:
        """Return tokens taken but not used (a completion shorter than its max_tokens); negative
        ``tokens`` take more, unchecked (a backend that generated past the grant): the bucket may go into debt."""
        self._refill()
        self._level = min(self._level + tokens, float(self.per_minute))

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(float(self.per_minute), self._level + (now - self._updated) * self.per_minute / 60.0)
        self._updated = now
