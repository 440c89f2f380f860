"""How many of a replica's decodes a stall of so many seconds pushes past a mean inter-token
latency target: the stall's cost in what goodput counts (issue 32).

A decode's mean ITL is its decode time over its output tokens less one. It keeps its current
pace for the tokens still to come, so its slack, the stall it absorbs and still ends within
``target_s``, is ``(target_s - pace) x (its whole output - 1)``. Only the engine knows how far a
decode has come (``DecodeProgress``); nobody knows where it will stop, only where it must
(``max_tokens``):

- a decode that has begun is guessed to make as many tokens again as it has made, within that
  bound. In ``bench simulate-pd`` this guess priced stalls as well as the simulation's own exact
  output lengths did;
- a request that has not begun (queued, or its prompt being prefilled) starts decoding during the
  stall, and is guessed to run to its bound: counted only where the client capped it short, as
  with the one- to twenty-token answers a leg's stall broke on Llama-3-8B. Guessing two tokens
  instead (any stall breaks it) cost Llama-3-70B 5 points of goodput; the exact lengths, which the
  simulation's bound is, mended Llama-3-8B without that loss (bench/notes/2026-12-03-pd-decode-slack.md).
  With a loose ``max_tokens`` such a request has seconds of slack and is not counted.

A decode already past the target costs nothing more: goodput has lost it.
"""

from collections.abc import Iterable

from protocol.replica_stats import DecodeProgress


def slack_s(decode: DecodeProgress, target_s: float) -> float:
    """Seconds of stall ``decode`` absorbs before its mean ITL ends past ``target_s`` (negative: past it now)."""
    if decode.tokens == 0:
        return target_s * (decode.tokens_left - 1)
    pace = decode.decode_s / (decode.tokens - 1) if decode.tokens > 1 else 0.0
    expected_tokens = min(decode.tokens + decode.tokens_left, 2 * decode.tokens)
    return (target_s - pace) * (expected_tokens - 1)


def decodes_pushed_past(decodes: Iterable[DecodeProgress], stall_s: float, target_s: float) -> int:
    """The decodes within ``target_s`` now that a stall of ``stall_s`` seconds puts past it."""
    return sum(1 for decode in decodes if 0.0 <= slack_s(decode, target_s) < stall_s)
