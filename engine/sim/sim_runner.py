"""A cost-model runner: the engine's scheduler and block manager with simulated forward passes.

It paces each step to the time the real model would take and returns pseudo tokens from a
cycle of ordinary words, so replicas behave like real ones (timing, cache hits, events) at a
fraction of the CPU. It never imports torch.

The modelled time is a step's whole wall time, from the end of the previous step to the end of
this one: the engine's own Python work in between (scheduling, streaming tokens out, KV events)
is part of it, not added on top. So a step of back-to-back work takes max(modelled, the engine's
own time), and ``bench simulate``, whose steps take exactly the modelled time, agrees with a
``--sim`` replica whenever the engine's CPU keeps up with the model.

Because it is a cost model and not a model, what it returns beyond tokens is fake but
well-formed, so that every endpoint can be exercised against it: logprobs are fixed values
(the sampled token first), embeddings a unit vector derived from the token ids by hashing,
and penalties, logit bias and seeds do not change its (deterministic) output.
"""

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from engine.model.runner_api import BlockTransfer, SeqChunk, TokenLogprobs

DEFAULT_HOST_BANDWIDTH_GBS = 25.0
"""Host <-> device copy bandwidth, GB/s: a PCIe 4.0 x16 link in practice (PCIe 5.0 about twice)."""
SIM_EMBEDDING_DIM = 64
"""Length of the simulated embedding vectors."""
SIM_TOKEN_LOGPROB = -0.25
"""The logprob the simulated runner reports for every token it samples."""

SIM_TEXT = (
    " the quick brown fox jumps over a lazy dog while seven small birds sing in green trees near an old stone bridge."
)
"""Pseudo output cycles through the tokens of this text, so simulated answers read as words."""


@dataclass(frozen=True)
class SimCosts:
    """Seconds a step takes: overhead + prefill tokens x per-token cost + decode batch cost.

    A decode step of ``b`` sequences holding ``c`` context tokens in all costs
    ``decode_base_s + b * decode_per_seq_s + c * decode_per_context_token_s``; prefill chunks
    cost ``prefill_per_token_s`` per new token plus ``prefill_per_token_context_s`` per new token
    per already-cached context token (attention over the cached prefix). Host-tier copies (an
    eviction to host memory, a host hit copied back) cost ``host_copy_per_token_s`` per token of
    the copied block, before the step: the model's KV bytes per token over the host link's
    bandwidth (``--sim-host-bandwidth-gbs`` recomputes it for the served model).
    """

    step_overhead_s: float
    prefill_per_token_s: float
    prefill_per_token_context_s: float
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_context_token_s: float
    host_copy_per_token_s: float = 0.0

    def step_seconds(self, chunks: list[SeqChunk]) -> float:
        seconds = self.step_overhead_s
        decodes = [chunk for chunk in chunks if len(chunk.token_ids) == 1]
        for chunk in chunks:
            if len(chunk.token_ids) > 1:
                new = len(chunk.token_ids)
                seconds += new * (self.prefill_per_token_s + chunk.start_pos * self.prefill_per_token_context_s)
        if decodes:
            context = sum(chunk.start_pos + 1 for chunk in decodes)
            seconds += (
                self.decode_base_s + len(decodes) * self.decode_per_seq_s + context * self.decode_per_context_token_s
            )
        return seconds


SMOLLM2_CPU = SimCosts(
    step_overhead_s=0.0,
    prefill_per_token_s=0.0084,
    prefill_per_token_context_s=6.9e-7,
    decode_base_s=0.0467,
    decode_per_seq_s=0.0078,
    decode_per_context_token_s=1.84e-5,
    host_copy_per_token_s=46_080 / (DEFAULT_HOST_BANDWIDTH_GBS * 1e9),
)
"""The real engine's runner on SmolLM2-135M, float32, block 16, CPU, one torch thread.

Fitted by ``python -m bench.engine.runner_timing --threads 1 --contexts 128 1024 --batches 1 8 32``
(best of 3 per shape) on the 2-core dev machine while it was shared with other jobs (load average
about 8): prefill of 2,000 tokens 16.8 s, 100 new tokens after 1,900 cached 0.97 s, decode steps
of batch 1 / 8 / 32 at context 1,024 in 94 / 197 / 916 ms. The step overhead is folded into the
other terms. An idle machine is several times faster; benchmarks scale all constants down (the
``--sim-*`` flags, or ``kvgate bench run --sim-prefill-us``, which scales every constant by one factor).
Host copies: SmolLM2-135M's float32 KV is 30 layers x 2 (K, V) x 3 KV heads x 64 dims x 4 bytes
= 46,080 bytes per token (``planner.kv_math.kv_bytes_per_token``), over ``DEFAULT_HOST_BANDWIDTH_GBS``.
"""

SIM_PRESETS: dict[str, SimCosts] = {"smollm2-cpu": SMOLLM2_CPU, "instant": SimCosts(0, 0, 0, 0, 0, 0)}
"""Named cost constants for ``--sim-preset``; ``instant`` takes no simulated time (tests)."""


class SimRunner:
    """Implements ``ModelRunner`` with ``SimCosts`` and a fixed cycle of word tokens.

    It has no logits to mask, so it cannot follow a grammar: the engine's server refuses requests
    that need one (``response_format`` json, vLLM's guided fields, a forced tool call) with a 400
    naming the field, rather than answer them with unconstrained words."""

    constrained_decoding = False

    def __init__(
        self,
        block_size: int,
        num_blocks: int,
        costs: SimCosts,
        word_token_ids: list[int],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.costs = costs
        self.word_token_ids = word_token_ids
        self._clock = clock
        self._sleep = sleep
        self._logprobs: dict[int, TokenLogprobs] = {}
        self._live: set[int] = set()
        """Sequences executed and not yet released: while any is left the engine has had work since
        the last step, so the next step starts where the last one ended."""
        self._last_step_end: float | None = None
        self._pending_transfer_s = 0.0

    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        self._pace(self.costs.step_seconds(chunks) + self._pending_transfer_s)
        self._pending_transfer_s = 0.0
        self._live.update(chunk.seq_id for chunk in chunks)
        tokens = [self._word_token(chunk) if chunk.sample else None for chunk in chunks]
        self._logprobs = {
            chunk.seq_id: self._fake_logprobs(token, chunk.sampling.logprobs)
            for chunk, token in zip(chunks, tokens, strict=True)
            if token is not None and chunk.sampling.logprobs is not None
        }
        return tokens

    def take_logprobs(self) -> dict[int, TokenLogprobs]:
        logprobs, self._logprobs = self._logprobs, {}
        return logprobs

    def embed(self, token_ids: list[int], lora_id: int = 0) -> list[float]:
        """A fake unit vector: the same ids (and adapter) always give the same vector, different ones another."""
        seed = xxhash.xxh64_intdigest(b"".join(token.to_bytes(4, "little") for token in token_ids), lora_id)
        values = [((seed >> (index % 64)) & 0xFF) - 127.5 + index for index in range(SIM_EMBEDDING_DIM)]
        norm = math.sqrt(sum(value * value for value in values))
        return [value / norm for value in values]

    def prompt_logprobs(self, token_ids: list[int], top: int, lora_id: int = 0) -> list[TokenLogprobs | None]:
        """The fake logprobs of each prompt token after the first (rank 1: the simulator has no distribution)."""
        fakes = [dataclasses.replace(self._fake_logprobs(token, top), rank=1) for token in token_ids[1:]]
        return [None, *fakes]

    def _fake_logprobs(self, token: int, top: int) -> TokenLogprobs:
        alternatives = [token] + [other for other in self.word_token_ids if other != token]
        return TokenLogprobs(
            token,
            SIM_TOKEN_LOGPROB,
            [(other, SIM_TOKEN_LOGPROB * (rank + 1)) for rank, other in enumerate(alternatives[:top])],
        )

    def _word_token(self, chunk: SeqChunk) -> int:
        """The cycle's token at the position being generated: a pure function of the sequence length."""
        return self.word_token_ids[(chunk.start_pos + len(chunk.token_ids)) % len(self.word_token_ids)]

    def transfer(self, transfers: list[BlockTransfer]) -> None:
        """Host-tier copies take their bandwidth's time, paid with the next step; there is no KV to move."""
        self._pending_transfer_s += len(transfers) * self.block_size * self.costs.host_copy_per_token_s

    def release(self, seq_id: int) -> None:
        self._live.discard(seq_id)

    def _pace(self, seconds: float) -> None:
        """Sleep until the step ends ``seconds`` after its start: the end of the previous step when
        the engine has worked since (a sequence of it is still live), else now (it was idle).

        A step that the engine already outlasted still sleeps zero seconds: like a real runner
        inside its kernels, every step lets go of the GIL, so the engine's event loop (requests
        in, tokens out) is not starved while the engine thread runs steps back to back."""
        now = self._clock()
        start = self._last_step_end if self._live and self._last_step_end is not None else now
        end = start + seconds
        self._sleep(max(end - now, 0.0))
        self._last_step_end = max(end, now)
