"""One request's tokens and its place in the paged KV cache."""

import time
from dataclasses import dataclass, field
from enum import Enum

from engine.model.lora_modules import LoRARef
from engine.model.runner_api import SamplingParams, TokenConstraint


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """A prompt and its generated tokens.

    ``token_ids`` holds prompt and output together; the KV of its first ``num_computed_tokens``
    positions is in the blocks of ``block_table``. A preempted sequence keeps its output and drops
    its blocks: its next prefill recomputes prompt + output, mostly from the prefix cache.
    """

    seq_id: int
    prompt_token_ids: list[int]
    sampling: SamplingParams
    max_total_tokens: int
    """Hard cap on prompt + output (the engine's max model length)."""
    cache_salt: str | None = None
    eos_token_id: int | None = None
    session: str | None = None
    """The client's session key (``kvgate_session``): a retention hint for the block manager."""
    adapter: LoRARef | None = None
    """The LoRA adapter the sequence runs under (None: the base model); it seeds its block hashes."""
    session_ttl_s: float | None = None
    """How long the session retains this turn (None: the engine's ``--session-ttl-s``)."""
    arrival_time: float = field(default_factory=time.monotonic)
    token_ids: list[int] = field(init=False)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None
    """Prompt tokens found in the prefix cache at first admission (None until admitted), host tier included."""
    num_host_hit_tokens: int = 0
    """Of the tokens found in cache at the last admission, those copied back from the host tier."""
    num_host_cached_tokens: int | None = None
    """Of ``num_cached_tokens``, those copied back from the host tier."""
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    """Chained hashes of the full blocks of ``token_ids`` computed so far (grows lazily)."""
    num_registered_blocks: int = 0
    """Leading blocks of ``block_table`` already offered to the prefix cache."""
    wanted_hashes: list[int] = field(default_factory=list)
    """While queued: the hashes of the cached prefix it will hit, kept from eviction for it."""
    computing: tuple[int, int] = (0, 0)
    """While running: the [start, end) indices of its full prompt blocks not yet computed, which
    a queued prompt sharing them waits for rather than computing them a second time."""
    finish_reason: str | None = None
    hold_kv: bool = False
    """A prefill leg (``kv_transfer_params.do_remote_decode``): when it finishes, its prompt's full
    blocks stay pinned for a decode engine to pull (``engine/server/kv_connector.py``)."""
    num_transferred_tokens: int = 0
    """Prompt tokens whose KV was pulled from a prefill engine and installed before admission."""
    constraint: TokenConstraint | None = field(init=False, default=None)
    """Its own place in ``sampling.constraint``'s grammar; kept across preemption, like its output."""

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        if self.sampling.constraint is not None:
            self.constraint = self.sampling.constraint.matcher()

    @property
    def adapter_name(self) -> str | None:
        return self.adapter.name if self.adapter is not None else None

    @property
    def lora_id(self) -> int:
        return self.adapter.lora_id if self.adapter is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def num_tokens_left(self) -> int:
        """Output tokens it may still sample before ``max_tokens`` or the context ends it."""
        left = min(self.sampling.max_tokens - self.num_output_tokens, self.max_total_tokens - len(self.token_ids))
        return max(left, 0)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        """Add a sampled token and set ``finish_reason`` if it ends the sequence."""
        self.token_ids.append(token_id)
        if self._ends(token_id):
            self.finish_reason = "stop"
        elif self.num_output_tokens >= self.sampling.max_tokens or len(self.token_ids) >= self.max_total_tokens:
            self.finish_reason = "length"

    def _ends(self, token_id: int) -> bool:
        """Whether ``token_id`` ends the output: the EOS token, or the last token its grammar allows."""
        if token_id == self.eos_token_id and not self.sampling.ignore_eos:
            return True
        if self.constraint is None:
            return False
        self.constraint.accept(token_id)
        return self.constraint.complete
