"""The contract between the scheduler and whatever computes a step (real model or cost model).

The scheduler decides, per step, which token span of which sequence to compute; the runner
computes it over the paged KV cache and samples a token where asked. The scheduler never imports
torch, so the simulated engine runs without it.
"""

from dataclasses import dataclass, field
from typing import Protocol


class TokenConstraint(Protocol):
    """One sequence's grammar state (``engine.model.grammar.GrammarMatcher``): it follows the sampled tokens."""

    def accept(self, token_id: int) -> None: ...

    @property
    def complete(self) -> bool:
        """True once nothing but the end of the sequence may follow."""
        ...


class Constraint(Protocol):
    """A checked grammar a request's output must match (``engine.model.grammar.Grammar``)."""

    @property
    def param(self) -> str:
        """The request field that asked for it."""
        ...

    def matcher(self) -> TokenConstraint:
        """A fresh state at the grammar's start, one per sequence."""
        ...


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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    """OpenAI penalties, applied as vLLM does: to the tokens generated so far, not the prompt."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    """None: no logprobs; k >= 0: the sampled token's logprob and the k most likely alternatives."""
    constraint: Constraint | None = None
    """The grammar every sampled token must keep the output inside (structured outputs, forced tools)."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """Whether logits are changed before the pick (penalties or a logit bias)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


@dataclass(frozen=True)
class TokenLogprobs:
    """The sampled token's log-probability and the ``k`` most likely tokens with theirs.

    Taken from the model's raw distribution (before temperature, penalties and bias), as vLLM's
    default ``raw_logprobs`` mode does.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    rank: int | None = None
    """The token's rank in the distribution (1: the most likely), where asked for (prompt logprobs)."""


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
    output_token_ids: list[int] = field(default_factory=list)
    """The generated tokens, filled only when ``sampling.penalized`` (penalties count them)."""
    lora_id: int = 0
    """The LoRA adapter the chunk runs under (its ``--lora-modules`` position from 1; 0: the base model)."""
    constraint: TokenConstraint | None = None
    """The sequence's grammar state when it samples under a constraint: the runner masks its logits."""


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
    constrained_decoding: bool
    """Whether ``execute`` honours ``SeqChunk.constraint`` (the simulated runner does not)."""

    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        """Compute one step; a sampled token id for each chunk with ``sample`` set, else None."""
        ...

    def transfer(self, transfers: list[BlockTransfer]) -> None:
        """Do the block copies, in order, before the next ``execute`` (they may reuse blocks and slots)."""
        ...

    def release(self, seq_id: int) -> None:
        """Forget any per-sequence state (sampler generators) of a finished or aborted sequence."""
        ...

    def take_logprobs(self) -> dict[int, TokenLogprobs]:
        """Logprobs of the tokens the last ``execute`` sampled, by seq_id, for chunks that asked."""
        ...

    def embed(self, token_ids: list[int], lora_id: int = 0) -> list[float]:
        """A pooled, L2-normalized embedding of ``token_ids`` (computed outside the paged cache)."""
        ...

    def prompt_logprobs(self, token_ids: list[int], top: int, lora_id: int = 0) -> list[TokenLogprobs | None]:
        """Each prompt token's logprob and rank given the tokens before it, with the ``top`` most likely
        tokens there (None for the first token); computed outside the paged cache."""
        ...
