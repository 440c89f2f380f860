"""The prefill rate a replica measures and reports (``prefill_tokens_per_s``): one rule, shared by
the engine and the simulated replicas of ``bench simulate``, so that the router sees the same rate
from both.

The rate is prefill tokens over the seconds they added to their steps, not over the steps' whole
time: a step also pays what a step without prefill costs (reading the weights, the batch's
decodes), and on a GPU that fixed part is most of a short prefill's step. Counted whole, it made
the rate follow the recent mix of prefill sizes (on an H100 preset 9,900 tok/s on a replica
lately doing short tails, 16,600 on one that had just run a 4k prompt), and the router sent a
burst 1.7x its share to the replicas that looked fast."""

DECAY = 0.9
"""Weight kept by past steps (an exponential moving average)."""
MIN_TOKENS = 64
"""Steps that prefill fewer tokens do not count: their time is nearly all the step's fixed cost,
so a stream of warm prompts' short tails (a prefix hit, KV pulled from a prefill replica)
measured a rate 10-100x too low and routing priced every prefill as if it ran at that rate."""
MIN_PREFILL_SHARE = 0.1
"""A prefill step is credited at least this share of its time as prefill, so that a step timed
faster than the decode-only average (noise, a smaller batch) cannot make the rate unbounded."""


class PrefillRate:
    def __init__(self) -> None:
        self._tokens = 0.0
        self._seconds = 0.0
        self._decode_seconds = 0.0
        self._decode_steps = 0.0

    def record(self, prefill_tokens: int, step_seconds: float) -> None:
        """One step that prefilled ``prefill_tokens`` in ``step_seconds`` (decodes included)."""
        if prefill_tokens == 0:
            self._decode_seconds = self._decode_seconds * DECAY + step_seconds
            self._decode_steps = self._decode_steps * DECAY + 1
            return
        if prefill_tokens >= MIN_TOKENS:
            decode_step_s = self._decode_seconds / self._decode_steps if self._decode_steps else 0.0
            prefill_seconds = max(step_seconds - decode_step_s, step_seconds * MIN_PREFILL_SHARE)
            self._tokens = self._tokens * DECAY + prefill_tokens
            self._seconds = self._seconds * DECAY + prefill_seconds

    @property
    def tokens_per_s(self) -> float | None:
        """None until a step with a real prefill was measured."""
        return self._tokens / self._seconds if self._seconds else None
