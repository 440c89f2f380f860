"""The contract between the scheduler and whatever computes a step (real model or cost model).

The scheduler decides, per step, which token span of which sequence to compute; the runner
computes it over the paged KV cache and samples a token where asked. The scheduler never imports
torch, so the simulated engine runs without it.
"""

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 means no top-k cut."""
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class SeqChunk:
    """One sequence's share of a step.

    ``token_ids`` are computed at positions ``start_pos .. start_pos + len(token_ids) - 1``; the KV
    of positions ``0 .. start_pos - 1`` is already in the cache. ``block_table`` lists the physical
    blocks covering positions ``0 .. start_pos + len(token_ids) - 1`` in order. A prefill chunk
    that does not end the prompt has ``sample`` False; the last prefill chunk and every decode
    step have it True and get one sampled token back.
    """

    seq_id: int
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: bool
    sampling: SamplingParams
    num_generated: int = 0
    """Tokens this sequence has generated so far (seeded sampling stays reproducible per step)."""


@dataclass(frozen=True)
class BlockTransfer:
    """One block's K/V copied between the device pool and the host tier (all layers)."""

    to_host: bool
    """True: device block -> host slot (an eviction); False: host slot -> device block (a host hit)."""
    device_block: int
    host_slot: int


class ModelRunner(Protocol):
    block_size: int
    num_blocks: int

    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        """Compute one step; a sampled token id for each chunk with ``sample`` set, else None."""
        ...

    def transfer(self, transfers: list[BlockTransfer]) -> None:
        """Do the block copies, in order, before the next ``execute`` (they may reuse blocks and slots)."""
        ...

    def release(self, seq_id: int) -> None:
        """Forget any per-sequence state (sampler generators) of a finished or aborted sequence."""
        ...
