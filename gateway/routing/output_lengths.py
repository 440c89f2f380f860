"""How long answers run, as a share of the bound the client gave them: what tells a router whether
a request still decoding will stop soon (issue 32).

A replica reports each decode's bound (``max_tokens``, or the context left) but not where it will
stop: an EOS ends most answers well before a loose ``max_tokens``. The gateway sees every
completed answer's length and bound, so it keeps the latest ones as ratios (length / bound): where
clients cap answers tightly the ratios sit at 1 and a bound is the length; where they send 4,096
for 200-token answers the ratios tell how far short of its bound an answer stops. A decode with
``k`` tokens so far and bound ``B`` is then taken to run as long as a recorded answer scaled to
``B``, among those longer than ``k``.
"""

import bisect
from collections import deque
from dataclasses import dataclass

MIN_ANSWERS = 32
"""Fewer completed answers than this say nothing yet (``fraction_shorter`` gives None)."""


@dataclass(frozen=True)
class AnswerLengthStats:
    """For operators: how many completed answers are known, and how much of its bound the median one used."""

    known: int
    median_share_of_bound: float | None
    """1.0: clients cap answers tightly; near 0: their ``max_tokens`` says little of where answers stop."""


class OutputLengths:
    """The last ``capacity`` completed answers' length / bound ratios, kept sorted."""

    def __init__(self, capacity: int = 2048) -> None:
        self._order: deque[float] = deque()
        self._sorted: list[float] = []
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._sorted)

    def stats(self) -> AnswerLengthStats:
        median = self._sorted[len(self._sorted) // 2] if self._sorted else None
        return AnswerLengthStats(len(self._sorted), median)

    def record(self, output_tokens: int, bound_tokens: int) -> None:
        """An answer completed with ``output_tokens`` of at most ``bound_tokens``."""
        if output_tokens < 1 or bound_tokens < 1:
            return
        ratio = min(output_tokens / bound_tokens, 1.0)
        if len(self._order) == self._capacity:
            oldest = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._order.append(ratio)
        bisect.insort(self._sorted, ratio)

    def fraction_shorter(self, made: int, bound_tokens: int, shorter_than: float) -> float | None:
        """Of answers with bound ``bound_tokens`` that run past ``made`` tokens, the share that stop
        before ``shorter_than`` tokens; None before ``MIN_ANSWERS`` answers are known, or when
        none known runs past ``made`` (the recorded answers say nothing of this one)."""
        if len(self._sorted) < MIN_ANSWERS or bound_tokens < 1:
            return None
        longer = bisect.bisect_right(self._sorted, made / bound_tokens)
        remaining = len(self._sorted) - longer
        if remaining == 0:
            return None
        shorter = bisect.bisect_left(self._sorted, shorter_than / bound_tokens) - longer
        return max(shorter, 0) / remaining
