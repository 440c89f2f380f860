"""Counts that fade: each key's total decays by e every ``time_constant_s`` (an exponentially
weighted rate), in a bounded table that forgets the least recently counted key first."""

import math
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class DecayingCounts(Generic[K]):
    def __init__(self, time_constant_s: float, max_keys: int) -> None:
        self.time_constant_s = time_constant_s
        self.max_keys = max_keys
        self._counts: dict[K, tuple[float, float]] = {}
        """key -> (count when last updated, when); oldest update first."""

    def __len__(self) -> int:
        return len(self._counts)

    def value(self, key: K, now: float) -> float:
        entry = self._counts.get(key)
        if entry is None:
            return 0.0
        count, then = entry
        return count * math.exp(-max(now - then, 0.0) / self.time_constant_s)

    def add(self, key: K, amount: float, now: float) -> float:
        """Count ``amount`` more for ``key``; returns its count before."""
        before = self.value(key, now)
        self._counts.pop(key, None)
        self._counts[key] = (before + amount, now)
        if len(self._counts) > self.max_keys:
            del self._counts[next(iter(self._counts))]
        return before
