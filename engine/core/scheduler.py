"""Continuous batching with chunked prefill and preemption by recomputation.

Each step spends a token budget: running sequences first, oldest first (a decode costs one
token, an unfinished prefill takes the next chunk that fits), then waiting sequences in arrival
order while blocks and the sequence cap allow. A waiting sequence whose prompt KV was pulled from
a prefill engine (P/D) lacks only its last block's tail: it is admitted right after the running
decodes, before the running prefills' chunks. In arrival order it waited out every chunk of the
prefills queued ahead of it (up to 1.9 s once its prefill leg was done, in ``bench simulate-pd``); now
it decodes beside those chunks, trading that wait for inter-token latency
(bench/notes/2026-12-03-pulled-requests-first.md). A waiting sequence whose next uncached block a
running sequence is computing stays queued until it is computed, and hits it then, instead of
computing the same prefix twice (a follow-up sent right behind its first turn). When a running sequence needs a block and none is
free, the newest running sequence is preempted: its blocks are freed (its full blocks stay in the
prefix cache) and it goes back to the head of the queue to be recomputed.

With ``max_loras`` (vLLM's ``--max-loras``), the running sequences use at most that many
distinct LoRA adapters, so no step holds more (base-model sequences do not count). A waiting
request for another adapter waits; base-model requests behind it may still start, but adapter
requests behind it wait too, so the running adapters drain and it cannot be starved by a
steady stream of requests for adapters already running.
"""

from collections import deque
from dataclasses import dataclass, field

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence, SequenceStatus
from engine.model.runner_api import BlockTransfer, SeqChunk
from radix.hashing import BlockHash


@dataclass
class ScheduledStep:
    seqs: list[Sequence]
    chunks: list[SeqChunk]
    transfers: list[BlockTransfer] = field(default_factory=list)
    """Host-tier copies to run before the chunks (evictions to host, host hits back to the device)."""

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of chunks that are not single-token decodes."""
        return sum(len(chunk.token_ids) for chunk in self.chunks if len(chunk.token_ids) > 1)


class Scheduler:
    def __init__(
        self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int, max_loras: int | None = None
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_loras = max_loras
        """Most distinct LoRA adapters among the running sequences; None: no limit."""
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute: what is left of running prefills, and whole waiting
        prompts. A waiting prompt's cached prefix is counted too, on purpose: subtracting it gives
        the prefill work exactly (and spares the router needless load spills), but that count no
        longer sees a replica taking on more sessions than its cache holds: on multi-turn every
        new session went to the one replica holding the system prompt, 86.7 % -> 67.9-75.1 % hits
        in real runs (bench/notes/2026-11-30-load-spills-on-synthetic-1600-measured-the-owner-s.md)."""
        prefilling = sum(
            seq.num_prompt_tokens - seq.num_computed_tokens
            for seq in self.running
            if seq.num_computed_tokens < seq.num_prompt_tokens
        )
        return prefilling + sum(seq.num_uncomputed_tokens for seq in self.waiting)

    def prefix_waits(self) -> dict[BlockHash, tuple[int, int]]:
        """Waiting sequences held behind a prefix block a running sequence is computing, per that
        block's hash: (their prompt tokens still to compute, how many); at most one entry per running
        sequence. A queued request that shares none of those blocks is admitted ahead of them
        (``schedule``); one that shares a block waits with them."""
        waits: dict[BlockHash, tuple[int, int]] = {}
        for seq in self.waiting:
            block_hash = self.block_manager.awaited_block(seq)
            if block_hash is not None:
                tokens, requests = waits.get(block_hash, (0, 0))
                waits[block_hash] = (tokens + seq.num_uncomputed_tokens, requests + 1)
        return waits

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; its cached prefix is kept from eviction until it is admitted."""
        self.block_manager.want_prefix(seq)
        self.waiting.append(seq)

    def schedule(self) -> ScheduledStep:
        """Pick this step's chunks; admitted sequences are given blocks and counted as running."""
        budget = self.max_num_batched_tokens
        step = ScheduledStep([], [])
        preempted = False
        pulled_waiting = any(seq.num_transferred_tokens for seq in self.waiting)
        prefilling: list[Sequence] = []
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            preemptions_before = self.num_preemptions
            if not self._make_room(seq):
                preempted = True
                break
            preempted |= self.num_preemptions > preemptions_before
            if pulled_waiting and seq.num_uncomputed_tokens > 1:
                prefilling.append(seq)
            else:
                budget -= self._add_chunk(step, seq, budget)
        adapters = {seq.lora_id for seq in self.running if seq.lora_id} if self.max_loras is not None else set()
        if pulled_waiting and not preempted:
            budget = self._admit(step, budget, adapters, pulled_only=True)
        for seq in prefilling:
            if budget == 0:
                break
            budget -= self._add_chunk(step, seq, budget)
        if not preempted:
            self._admit(step, budget, adapters, pulled_only=False)
        step.transfers = self.block_manager.take_transfers()
        return step

    def _admit(self, step: ScheduledStep, budget: int, adapters: set[int], pulled_only: bool) -> int:
        """Start waiting sequences in arrival order while the budget, blocks and the sequence cap
        allow (with ``pulled_only``, only those whose prompt KV was pulled); the budget left."""
        position = 0  # requests before it stay queued: for an adapter slot or a prefix being computed
        adapter_blocked = False
        while position < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[position]
            if pulled_only and not seq.num_transferred_tokens:
                position += 1
                continue
            if seq.lora_id and not self._adapter_fits(seq.lora_id, adapters, adapter_blocked):
                adapter_blocked = True
                position += 1
                continue
            if self.block_manager.waits_for_prefix(seq):
                position += 1
                continue
            if not self.block_manager.allocate(seq):
                break
            del self.waiting[position]
            if seq.lora_id:
                adapters.add(seq.lora_id)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = seq.num_computed_tokens
                seq.num_host_cached_tokens = seq.num_host_hit_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget -= self._add_chunk(step, seq, budget)
        return budget

    def postprocess(self, step: ScheduledStep, sampled: list[int | None]) -> None:
        """Record computed chunks, cache newly full blocks and append sampled tokens."""
        for seq, chunk, token_id in zip(step.seqs, step.chunks, sampled, strict=False):
            seq.num_computed_tokens += len(chunk.token_ids)
            self.block_manager.register_computed_blocks(seq)
            if token_id is not None:
                seq.append_token(token_id)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            self.block_manager.release_wants(seq)
        seq.status = SequenceStatus.FINISHED

    def assert_invariants(self) -> None:
        """The block manager's invariants, checked against this scheduler's queues."""
        self.block_manager.assert_invariants(self.waiting, self.running)

    def _adapter_fits(self, lora_id: int, running: set[int], behind_a_waiting_one: bool) -> bool:
        """Whether a waiting request for adapter ``lora_id`` may start beside the ``running`` adapters.

        Not behind a request already left waiting for an adapter slot: it is first in line."""
        if self.max_loras is None:
            return True
        return not behind_a_waiting_one and (lora_id in running or len(running) < self.max_loras)

    def _make_room(self, seq: Sequence) -> bool:
        """Ensure ``seq`` has blocks for all its tokens, preempting newer sequences as needed.

        Returns False when ``seq`` itself had to be preempted.
        """
        while not self.block_manager.can_append(seq):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        self.block_manager.append_slots(seq)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.block_manager.want_prefix(seq)
        self.num_preemptions += 1

    def _add_chunk(self, step: ScheduledStep, seq: Sequence, budget: int) -> int:
        start = seq.num_computed_tokens
        end = start + min(seq.num_uncomputed_tokens, budget)
        step.seqs.append(seq)
        step.chunks.append(
            SeqChunk(
                seq_id=seq.seq_id,
                token_ids=seq.token_ids[start:end],
                start_pos=start,
                block_table=seq.block_table[: self.block_manager.blocks_for(end)],
                sample=end == len(seq.token_ids),
                sampling=seq.sampling,
                num_generated=seq.num_output_tokens,
                output_token_ids=seq.output_token_ids if seq.sampling.penalized else [],
                lora_id=seq.lora_id,
                constraint=seq.constraint if end == len(seq.token_ids) else None,
            )
        )
        return end - start
