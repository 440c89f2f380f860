"""What a workload generator produces: requests with their timing, prompt and affinity key."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload.

    It starts at ``arrival_s`` after the run begins, or ``think_s`` after the previous request of
    the same ``session_id`` finished, whichever is later (closed-loop runs ignore ``arrival_s``).
    Exactly one of ``prompt_ids`` (sent to /v1/completions) and ``messages`` (sent to
    /v1/chat/completions) is set.
    """

    request_id: str
    session_id: str
    arrival_s: float
    max_tokens: int
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    canonical_messages: tuple[dict[str, Any], ...] | None = None
    """The messages as normalization should leave them (for offline bounds); None: ``messages``."""
    user: str | None = None
    """Sent as the OpenAI ``user`` field: the key the ``session`` policy sticks on."""
    think_s: float = 0.0
    group: str = ""
    """The prefix group (for per-group summaries)."""

    def __post_init__(self) -> None:
        if (self.prompt_ids is None) == (self.messages is None):
            raise ValueError("a BenchRequest has exactly one of prompt_ids and messages")

    @property
    def is_chat(self) -> bool:
        return self.messages is not None
