"""Prefix breakers: the token positions where otherwise identical prompts start to differ.

A timestamp or request id early in a system prompt makes every request differ from the one
before at that position, and the prefix cache misses everything after it although the rest of
the prompt is the same. For each request this finds the recent prompt it shares the longest
prefix with, checks whether the two agree again a few tokens after they first differ, and if a
long stretch agrees afterwards, counts a breaker at that position: the spot an operator should
make stable (or cover with a volatile-span normalization rule).

Comparing costs a few hundred microseconds for a long prompt, so at most `samples_per_s`
requests a second are compared (all of them at low rates); counts are of sampled requests.
"""

import math
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

MAX_COMPARED_TOKENS = 4096
RECENT_PROMPTS = 32
CANDIDATES_CHECKED = 4
MAX_SPAN_TOKENS = 64
"""Longest varying span looked for; a longer difference is a different prompt, not a breaker."""
RESYNC_TOKENS = 8
"""Tokens that must agree in a row for the prompts to count as agreeing again."""
MIN_LOST_TOKENS = 32
"""Agreeing tokens after the span needed to call the span a breaker."""
MAX_GROUPS = 256
CONTEXT_TOKENS = 32
NO_TEXT_PREVIEW = "(approximate tokens: no text)"

_MASKS = ((re.compile(r"[0-9]"), "9"), (re.compile(r"[^\W\d_]"), "x"))


@dataclass(frozen=True)
class Breaker:
    """One request's break from a recent prompt that agrees with it again afterwards."""

    position: int
    """Index of the first token that differs."""
    span_tokens: int
    """Tokens of this request that differ before the prompts agree again."""
    lost_tokens: int
    """Tokens after the span that agree with the recent prompt but cannot be cached."""


@dataclass
class BreakerGroup:
    """Every breaker of one model seen at one token position."""

    model: str
    position: int
    requests: int = 0
    lost_tokens: int = 0
    preview: str = ""
    last_seen: float = 0.0

    def row(self, block_size: int) -> dict:
        return {
            "model": self.model,
            "position": self.position,
            "block": self.position // block_size,
            "requests": self.requests,
            "mean_lost_tokens": round(self.lost_tokens / self.requests, 1),
            "preview": self.preview,
            "last_seen": self.last_seen,
        }


def find_breaker(prompt: np.ndarray, recent: list[np.ndarray]) -> Breaker | None:
    """The breaker between ``prompt`` and the recent prompt it shares the longest prefix with."""
    candidates = []
    for other in recent:
        shared = _common_prefix(prompt, other)
        if shared < min(len(prompt), len(other)):
            candidates.append((shared, other))
    candidates.sort(key=lambda candidate: candidate[0], reverse=True)
    for position, other in candidates[:CANDIDATES_CHECKED]:
        breaker = _resync(prompt, other, position)
        if breaker is not None:
            return breaker
    return None


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Tokens ``a`` and ``b`` share from the start (``argmax`` finds the first difference without
    listing them all: half the time of ``flatnonzero`` on 2,048-token prompts)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differs = a[:n] != b[:n]
    first = int(differs.argmax())
    return first if differs[first] else n


def _resync(a: np.ndarray, b: np.ndarray, position: int) -> Breaker | None:
    """Where after ``position`` the two prompts agree again for a long stretch, if they do.

    The span of ``a`` is at least one token: a prompt that only lacks the other's span is counted
    when the other (the one holding the varying text) is compared.
    """
    window = MAX_SPAN_TOKENS + RESYNC_TOKENS
    a_window, b_window = a[position : position + window], b[position : position + window]
    b_offsets: dict[bytes, int] = {}
    for offset in range(len(b_window) - RESYNC_TOKENS, -1, -1):
        b_offsets[b_window[offset : offset + RESYNC_TOKENS].tobytes()] = offset
    for a_offset in range(len(a_window) - RESYNC_TOKENS + 1):
        b_offset = b_offsets.get(a_window[a_offset : a_offset + RESYNC_TOKENS].tobytes())
        if b_offset is None:
            continue
        lost = _common_prefix(a[position + a_offset :], b[position + b_offset :])
        if lost < MIN_LOST_TOKENS or a_offset == 0:
            return None
        return Breaker(position, a_offset, lost)
    return None


def redacted_preview(before: str, span: str, context_chars: int) -> str:
    """The stable text just before the break, then the varying span with digits and letters masked."""
    masked = span
    for pattern, mask in _MASKS:
        masked = pattern.sub(mask, masked)
    context = before[-context_chars:] if context_chars else ""
    return f"{context}⟦{masked}⟧".replace("\r", "").replace("\n", "↵")


class PrefixBreakers:
    """Breaker groups over recent traffic, per model and token position (bounded, LRU)."""

    def __init__(self, block_size: int, preview_chars: int, samples_per_s: float) -> None:
        self.block_size = block_size
        self.preview_chars = preview_chars
        self.sample_interval_s = 1.0 / samples_per_s
        self._last_sample = -math.inf
        self._recent: dict[str, deque[np.ndarray]] = {}
        self._groups: OrderedDict[tuple[str, int], BreakerGroup] = OrderedDict()

    def observe(self, model: str, token_ids: list[int], decode: Callable[[list[int]], str] | None) -> Breaker | None:
        """Compare one prompt (if sampled) with recent ones of its model; count and return its breaker.

        ``decode`` turns token ids back into text for the preview; None for a model routed on
        approximate text blocks, whose pseudo-tokens have no text.
        """
        now = time.monotonic()
        if now - self._last_sample < self.sample_interval_s:
            return None
        self._last_sample = now
        compared = token_ids[:MAX_COMPARED_TOKENS]
        prompt = np.fromiter(compared, dtype=np.int64, count=len(compared))
        recent = self._recent.setdefault(model, deque(maxlen=RECENT_PROMPTS))
        breaker = find_breaker(prompt, list(recent))
        recent.append(prompt)
        if breaker is not None:
            self._count(model, breaker, token_ids, decode)
        return breaker

    def _count(
        self, model: str, breaker: Breaker, token_ids: list[int], decode: Callable[[list[int]], str] | None
    ) -> None:
        key = (model, breaker.position)
        group = self._groups.pop(key, None) or BreakerGroup(model, breaker.position)
        self._groups[key] = group
        while len(self._groups) > MAX_GROUPS:
            self._groups.popitem(last=False)
        group.requests += 1
        group.lost_tokens += breaker.lost_tokens
        group.preview = self._preview(breaker, token_ids, decode)
        group.last_seen = time.time()

    def _preview(self, breaker: Breaker, token_ids: list[int], decode: Callable[[list[int]], str] | None) -> str:
        if decode is None:
            return NO_TEXT_PREVIEW
        start = breaker.position
        before = decode(token_ids[max(0, start - CONTEXT_TOKENS) : start])
        return redacted_preview(before, decode(token_ids[start : start + breaker.span_tokens]), self.preview_chars)

    def table(self, limit: int = 20) -> list[dict]:
        """The groups that cost the most cached tokens, worst first."""
        groups = sorted(self._groups.values(), key=lambda group: group.lost_tokens, reverse=True)
        return [group.row(self.block_size) for group in groups[:limit]]
