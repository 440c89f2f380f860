"""The prefill rate a replica measures and reports (``prefill_tokens_per_s``): one rule, shared by
the engine and the simulated replicas of ``bench simulate``, so that the router sees the same rate
from both."""

DECAY = 0.9
"""Weight kept by past steps (an exponential moving average)."""
MIN_TOKENS = 64
"""Steps that prefill fewer tokens do not count: their time is the step's fixed cost (a forward
pass, the batch's decodes), so a stream of warm prompts' short tails (a prefix hit, KV pulled from
a prefill replica) measured a rate 10-100x too low and routing priced every prefill as if it ran
at that rate."""


class PrefillRate:
    def __init__(self) -> None:
        self._tokens = 0.0
        self._seconds = 0.0

    def record(self, prefill_tokens: int, step_seconds: float) -> None:
        """One step that prefilled ``prefill_tokens`` in ``step_seconds`` (decodes included)."""
        if prefill_tokens >= MIN_TOKENS:
            self._tokens = self._tokens * DECAY + prefill_tokens
            self._seconds = self._seconds * DECAY + step_seconds

    @property
    def tokens_per_s(self) -> float | None:
        """None until a step with a real prefill was measured."""
        return self._tokens / self._seconds if self._seconds else None
