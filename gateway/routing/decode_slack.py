"""How many of a replica's decodes a stall of so many seconds pushes past a mean inter-token
latency target: the stall's cost in what goodput counts (issue 32).

A decode's mean ITL is its decode time over its output tokens less one. It keeps its current
pace for the tokens still to come, so its slack, the stall it absorbs and still ends within
``target_s``, is ``(target_s - pace) x (its whole output - 1)``: a stall breaks it when its whole
output is shorter than ``1 + stall / (target_s - pace)`` tokens. Only the engine knows how far a
decode has come (``DecodeProgress``: tokens so far, their decode time, the bound ``max_tokens`` or
the context puts on the rest); nobody knows where it will stop:

- a decode that has begun is guessed to make as many tokens again as it has made, within its
  bound. In ``bench simulate-pd`` this guess priced stalls as well as the simulation's own exact
  output lengths did;
- a request that has not begun (queued, or its prompt being prefilled) starts decoding during the
  stall. It counts as the share of the answers the gateway has seen completed (``OutputLengths``:
  length over bound) that, scaled to its bound, stop short enough to be broken: exactly where
  clients cap ``max_tokens`` tightly (every answer ends at its bound), by the odds where they send
  4,096 for 200-token answers. With clients sending 4,096 in ``bench simulate-pd`` this kept a
  fleet of ``both`` replicas at or above the better of aggregated and always-disaggregate on 41 of
  43 windows (35 when such a request was guessed to run to its bound, and 39 when started decodes
  were priced by the answers too; bench/notes/2026-12-03-pd-answer-lengths.md). Until 32 answers
  are known it is guessed to run to its bound.

A decode already past the target costs nothing more: goodput has lost it.
"""

from collections import Counter
from collections.abc import Iterable

from gateway.routing.output_lengths import OutputLengths
from protocol.replica_stats import DecodeProgress


def slack_s(decode: DecodeProgress, target_s: float) -> float:
    """Seconds of stall ``decode`` absorbs before its mean ITL ends past ``target_s`` (negative: past it now)."""
    if decode.tokens == 0:
        return target_s * (decode.tokens_left - 1)
    pace = decode.decode_s / (decode.tokens - 1) if decode.tokens > 1 else 0.0
    expected_tokens = min(decode.tokens + decode.tokens_left, 2 * decode.tokens)
    return (target_s - pace) * (expected_tokens - 1)


def decodes_pushed_past(
    decodes: Iterable[DecodeProgress], stall_s: float, target_s: float, lengths: OutputLengths | None = None
) -> float:
    """The decodes within ``target_s`` now that a stall of ``stall_s`` seconds puts past it. With
    ``lengths`` (the gateway's completed answers), a request not yet decoding counts as the share of
    answers of its bound that stop short enough to end past the target (looked up once per bound:
    queued requests mostly share a few)."""
    if lengths is None:
        return float(sum(1 for decode in decodes if 0.0 <= slack_s(decode, target_s) < stall_s))
    pushed = 0.0
    queued_bounds: Counter[int] = Counter()
    for decode in decodes:
        if decode.tokens == 0:
            queued_bounds[decode.tokens_left] += 1
        else:
            pushed += 0.0 <= slack_s(decode, target_s) < stall_s
    for bound, count in queued_bounds.items():
        broken = lengths.fraction_shorter(1, bound, 1 + stall_s / target_s)
        if broken is None:
            broken = float(0.0 <= slack_s(DecodeProgress(0, 0.0, bound), target_s) < stall_s)
        pushed += count * broken
    return pushed
