"""One bundled-engine replica on a virtual clock: the engine's real scheduler and block manager,
with each step taking the time the sim cost model says instead of sleeping it.

It mirrors ``engine/core/llm_engine.py``'s loop: requests that arrive during a step join the next
one; after every step the block manager's KV events are handed on (to the router's index, as
the gateway's subscriber would) and each sampled token is timed. What the gateway's health
checks read from ``/stats`` (running, waiting, measured prefill rate) is ``report()``, with
``decodes()``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.block_manager import BlockManager
from engine.core.decode_progress import decode_progress
from engine.core.prefill_rate import PrefillRate
from engine.core.scheduler import ScheduledStep, Scheduler
from engine.core.sequence import Sequence
from engine.core.session_retention import SessionRetention
from engine.model.runner_api import SamplingParams
from engine.sim.sim_runner import SimCosts
from protocol.replica_stats import DecodeProgress
from radix.kv_event_format import KVEvent

WORD_TOKENS = 50
"""Pseudo output tokens cycle through this many ids (their values never matter to a prompt)."""
EOS_TOKEN = 999
"""The id a request with its own answer length (``stop_after``) ends with, as an EOS ends an answer."""


@dataclass
class SimRequest:
    """A request in flight on a replica, and its timings in virtual seconds."""

    seq: Sequence
    sent_s: float
    on_first_token: Callable[[float], None]
    on_finished: Callable[["SimRequest", float], None]
    first_token_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    hold_prompt_blocks: bool = False
    stop_after: int | None = None
    """The answer's own length, where it ends (an EOS) before its ``max_tokens``; None: it runs to them."""
    pinned: list[int] = field(default_factory=list)
    """A prefill leg's full prompt blocks, pinned at its end for the decode side's pull."""


class SimReplica:
    def __init__(
        self,
        name: str,
        num_blocks: int,
        block_size: int,
        model: str,
        costs: SimCosts,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        host_blocks: int = 0,
        retention: SessionRetention | None = None,
    ) -> None:
        """``host_blocks`` and ``retention`` are the engine's ``--host-kv-blocks`` tier and its
        session retention (give the retention the virtual clock)."""
        self.name = name
        self.costs = costs
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(num_blocks, block_size, model, host_blocks, retention)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens)
        self.busy_until: float | None = None
        """End of the step in progress; None when idle."""
        self.served = 0
        self._requests: dict[int, SimRequest] = {}
        self._next_seq_id = 0
        self._step: ScheduledStep | None = None
        self._prefill_rate = PrefillRate()

    def add(
        self,
        prompt: list[int],
        max_tokens: int,
        now: float,
        on_first_token: Callable[[float], None],
        on_finished: Callable[[SimRequest, float], None],
        session: str | None = None,
        hold_prompt_blocks: bool = False,
        stop_after: int | None = None,
    ) -> None:
        """``session`` is the request's retention hint (``kvgate_session``); ``hold_prompt_blocks``:
        a prefill leg, whose full prompt blocks stay pinned for the decode side's pull after it
        finishes (``SimRequest.pinned``; ``unpin`` them); ``stop_after``: ``SimRequest.stop_after``."""
        seq = self._add(prompt, max_tokens, now, on_first_token, on_finished, session, True, stop_after)
        self._requests[seq.seq_id].hold_prompt_blocks = hold_prompt_blocks

    def _add(
        self,
        prompt: list[int],
        max_tokens: int,
        now: float,
        on_first_token: Callable[[float], None],
        on_finished: Callable[[SimRequest, float], None],
        session: str | None,
        queue: bool,
        stop_after: int | None,
    ) -> Sequence:
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=stop_after is None)
        seq = Sequence(
            self._next_seq_id,
            list(prompt),
            sampling,
            self.max_model_len,
            eos_token_id=EOS_TOKEN,
            arrival_time=now,
            session=session,
        )
        self._next_seq_id += 1
        self._requests[seq.seq_id] = SimRequest(seq, now, on_first_token, on_finished, stop_after=stop_after)
        if queue:
            self.scheduler.add(seq)
        return seq

    def prefix_hit_blocks(self, prompt: list[int]) -> int:
        """Leading full blocks of ``prompt`` cached here: what a decode side need not pull."""
        probe = Sequence(-1, list(prompt), SamplingParams(max_tokens=1), self.max_model_len)
        return self.block_manager.num_prefix_hit_blocks(probe)

    def add_pulled(
        self,
        prompt: list[int],
        max_tokens: int,
        now: float,
        first: int,
        count: int,
        on_first_token: Callable[[float], None],
        on_finished: Callable[[SimRequest, float], None],
        session: str | None = None,
        stop_after: int | None = None,
    ) -> None:
        """The decode side of a split once the pulled blocks ``first .. first + count`` arrive, as
        the bundled connector does it in one engine step: cache them under the prompt's hashes
        (``install_remote``), queue the sequence, drop the install's references; the queued
        sequence then hits them through the normal prefix path."""
        seq = self._add(prompt, max_tokens, now, on_first_token, on_finished, session, False, stop_after)
        manager = self.block_manager
        manager.want_prefix(seq)
        taken = manager.install_remote(seq, first, count)
        manager.release_wants(seq)
        seq.num_transferred_tokens = len(taken) * manager.block_size
        self.scheduler.add(seq)
        manager.unpin([block_id for _, block_id in taken])

    def unpin(self, block_ids: list[int]) -> None:
        """A prefill leg's held blocks were pulled (or given up): they may be evicted again."""
        self.block_manager.unpin(block_ids)

    def start_step(self, now: float) -> float | None:
        """Schedule the next step if there is work; its end time, or None (idle or stalled)."""
        if self.busy_until is not None or not self.scheduler.has_work:
            return None
        step = self.scheduler.schedule()
        if not step.chunks:
            return None
        seconds = self.costs.step_seconds(step.chunks)
        seconds += len(step.transfers) * self.block_size * self.costs.host_copy_per_token_s
        self._prefill_rate.record(step.num_prefill_tokens, seconds)
        self._step = step
        self.busy_until = now + seconds
        return self.busy_until

    def finish_step(self, now: float) -> list[KVEvent]:
        """Complete the step in progress at ``now``; the KV events it produced."""
        step, self._step, self.busy_until = self._step, None, None
        assert step is not None
        sampled: list[int | None] = [
            self._sampled(seq, chunk.start_pos + len(chunk.token_ids)) if chunk.sample else None
            for seq, chunk in zip(step.seqs, step.chunks, strict=True)
        ]
        self.scheduler.postprocess(step, sampled)
        for seq, token in zip(step.seqs, sampled, strict=True):
            if token is not None:
                self._advance(self._requests[seq.seq_id], now)
        return self.block_manager.drain_events()

    def report(self) -> dict[str, float | int]:
        """The numbers the engine's /stats gives the gateway."""
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "prefill_tokens_per_s": self._prefill_rate.tokens_per_s or 0.0,
        }

    def decodes(self) -> list[DecodeProgress]:
        """Each request's decode progress, running or queued, as the engine's load report gives it (``ReplicaLoad.decodes``)."""
        progress = (
            decode_progress(
                request.seq, request.first_token_s, request.token_times_s[-1] if request.token_times_s else None
            )
            for request in self._requests.values()
        )
        return [decode for decode in progress if decode is not None]

    def _sampled(self, seq: Sequence, position: int) -> int:
        """The token ``seq`` samples at ``position``: its EOS once its answer is as long as it will be."""
        stop_after = self._requests[seq.seq_id].stop_after
        if stop_after is not None and seq.num_output_tokens + 1 >= stop_after:
            return EOS_TOKEN
        return _word_token(position)

    def _advance(self, request: SimRequest, now: float) -> None:
        seq = request.seq
        if request.first_token_s is None:
            request.first_token_s = now
            request.on_first_token(now)
        request.token_times_s.append(now)
        if seq.finish_reason is not None:
            if request.hold_prompt_blocks:
                request.pinned = seq.block_table[: (seq.num_prompt_tokens - 1) // self.block_size]
                self.block_manager.pin(request.pinned)
            del self._requests[seq.seq_id]
            self.scheduler.finish(seq)
            self.served += 1
            request.on_finished(request, now)


def _word_token(position: int) -> int:
    return 1000 + position % WORD_TOKENS
