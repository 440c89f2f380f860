"""How many of a replica's running decodes a stall of so many seconds pushes past a mean
inter-token latency target: the stall's cost in what goodput counts (issue 32).

A decode's mean ITL is its decode time over its output tokens less one. It keeps its current
pace for the tokens still to come, so its slack, the stall it absorbs and still ends within
``target_s``, is ``(target_s - pace) x (its whole output - 1)``. Only the engine knows how far a
decode has come (``DecodeProgress``); nobody knows where it will stop, only where it must
(``max_tokens``): the guess is as many tokens again as it has produced, at least one, within that
bound. In ``bench simulate-pd`` that guess priced stalls as well as the simulation's own exact
output lengths did (bench/notes/2026-12-03-pd-decode-slack.md). A decode already past the target
costs nothing more: goodput has lost it.
"""

from collections.abc import Iterable

from protocol.replica_stats import DecodeProgress


def slack_s(decode: DecodeProgress, target_s: float) -> float:
    """Seconds of stall ``decode`` absorbs before its mean ITL ends past ``target_s`` (negative: past it now)."""
    pace = decode.decode_s / (decode.tokens - 1) if decode.tokens > 1 else 0.0
    expected_tokens = min(decode.tokens + decode.tokens_left, max(2 * decode.tokens, 2))
    return (target_s - pace) * (expected_tokens - 1)


def decodes_pushed_past(decodes: Iterable[DecodeProgress], stall_s: float, target_s: float) -> int:
    """The decodes within ``target_s`` now that a stall of ``stall_s`` seconds puts past it."""
    return sum(1 for decode in decodes if 0.0 <= slack_s(decode, target_s) < stall_s)
