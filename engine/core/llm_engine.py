"""The engine loop: requests in, token deltas out, one step at a time on a worker thread.

The aiohttp event loop never computes: it hands commands (add, abort, reset) to the engine
thread through a queue, and the engine thread hands each step's outputs back with one
``call_soon_threadsafe``. Scheduler, block manager and runner are touched only by the engine
thread, so they need no locks.
"""

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from engine.core.block_manager import BlockManager
from engine.core.decode_progress import decode_progress
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.kv_events import KVEventPublisher, Snapshot
from engine.core.kv_transfer_blocks import BlockIO
from engine.core.kv_transfer_types import KVHold, RemoteKV
from engine.core.load_reading import LoadReading
from engine.core.metrics import EngineMetrics
from engine.core.prefill_rate import PrefillRate
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.model.lora_modules import LoRARef
from engine.model.runner_api import ModelRunner, SamplingParams, TokenLogprobs
from protocol.load_mark import LoadMark
from protocol.replica_stats import DecodeProgress, PrefixWait, ReplicaLoad, ReplicaStats
from radix.hashing import extend_block_hashes, hash_to_bytes
from radix.kv_event_format import AllBlocksCleared, KVEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestTimes:
    """When a sequence arrived, was first scheduled, produced its first token and finished (monotonic s)."""

    arrival: float
    scheduled: float
    first_token: float
    finished: float


@dataclass
class RequestOutput:
    """What one step produced for one of a request's ``n`` sequences (choice ``index``)."""

    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    error: str | None = None
    index: int = 0
    logprobs: TokenLogprobs | None = None
    times: RequestTimes | None = None
    """Set on a sequence's last output (for the engine's trace spans)."""
    stop_reason: str | None = None
    """The stop string that ended the sequence (vLLM's ``stop_reason``); None for EOS, length or a grammar's end."""
    kv_hold: KVHold | None = None
    """On a prefill leg's last output: its prompt blocks, pinned for a decode engine to pull."""


class EngineError(RuntimeError):
    """The engine failed while computing a request (not the client's fault)."""


_Delivery = tuple[asyncio.Queue[RequestOutput], RequestOutput]
"""An output and the queue of the request it belongs to."""


@dataclass
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    outputs: asyncio.Queue[RequestOutput]
    index: int = 0
    cache_lookup_counted: bool = False
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    forks: list["_Request"] = field(default_factory=list)
    """Sibling samples (``n > 1``) added once this one's prompt is in the prefix cache."""
    remote_kv: RemoteKV | None = None
    """Blocks pulled from a prefill engine, installed when the request is queued."""


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        tokenizer: Tokenizer,
        metrics: EngineMetrics,
        publisher: KVEventPublisher | None = None,
        check_invariants: bool = False,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.block_manager: BlockManager = scheduler.block_manager
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.publisher = publisher
        self.check_invariants = check_invariants
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._requests: dict[int, _Request] = {}
        self._seq_ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._prefill_rate = PrefillRate()
        self.started_at = time.time()
        """When this engine started (its load reports say, so a gateway knows a restart emptied its cache)."""
        self._load = LoadReading()
        self._prefix_waits: list[PrefixWait] = []
        self._announced: deque[list[bytes]] = deque()
        """Block hashes of the prompts queued since the load socket last read them (engine thread
        appends, publisher thread takes: a deque's append and popleft are thread-safe)."""
        self.announce_prompts = False
        """Set by the load socket, the only reader of announcements."""
        self.on_admitted: Callable[[], None] = lambda: None
        """Called on the engine thread when new requests are queued (the load publisher sends at once)."""
        self.on_hold: Callable[[list[int], list[bytes]], str] | None = None
        """Set by the KV connector: registers a finished prefill leg's pinned blocks (ids, hashes), returns the transfer id."""
        self.kv_io: BlockIO | None = None
        """Set by the KV connector: writes pulled blocks' bytes into the pool."""
        if publisher is not None:
            publisher.serve_snapshots(self.request_snapshot)
        metrics.track_state(
            lambda: self.block_manager.usage, lambda: len(self.scheduler.running), lambda: len(self.scheduler.waiting)
        )
        metrics.track_adapters(self.adapters_in_use)
        metrics.track_host_tier(lambda: len(self.block_manager.host), lambda: self.block_manager.host.usage)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()
        if self.publisher is not None:
            self.publisher.start()

    def stop(self) -> None:
        """Stop the engine thread after its current step and close the event publisher."""
        if self._thread is not None:
            self._commands.put(None)
            self._thread.join()
            self._thread = None
        if self.publisher is not None:
            self.publisher.close()

    async def generate(
        self,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        max_total_tokens: int,
        eos_token_id: int | None,
        cache_salt: str | None = None,
        session: str | None = None,
        session_ttl_s: float | None = None,
        n: int = 1,
        adapter: LoRARef | None = None,
        hold_kv: bool = False,
        remote_kv: RemoteKV | None = None,
        load_mark: LoadMark | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream the outputs of ``n`` samples of one prompt; closing the iterator early aborts them.

        The first sample is prefilled alone; the others start once its prompt blocks are in the
        prefix cache, so they share the prompt's full KV blocks and compute only its tail. A
        seeded request gives sample ``i`` the seed ``seed + i``, as vLLM does. ``session`` (the
        request's ``kvgate_session``) asks the block manager to keep this turn's blocks longer
        than one-shot blocks, for ``session_ttl_s`` (None: the engine's default). ``adapter`` runs the samples under that LoRA adapter.
        ``hold_kv`` (a prefill leg, n 1) pins the prompt's blocks at the end for a decode engine;
        ``remote_kv`` (a decode leg) installs blocks pulled from a prefill engine before queueing.
        ``load_mark`` (its sender's ``x-kvgate-load-mark``) is acknowledged by every load reading from now on.
        """
        outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()
        requests = []
        for index in range(n):
            params = (
                sampling
                if sampling.seed is None or index == 0
                else dataclasses.replace(sampling, seed=sampling.seed + index)
            )
            seq = Sequence(
                next(self._seq_ids),
                prompt_token_ids,
                params,
                max_total_tokens,
                cache_salt,
                eos_token_id,
                session,
                adapter=adapter,
                session_ttl_s=session_ttl_s,
                hold_kv=hold_kv,
            )
            requests.append(_Request(seq, IncrementalDetokenizer(self.tokenizer, params.stop), outputs, index))
        first = requests[0]
        first.forks = requests[1:]
        first.remote_kv = remote_kv
        self._load.arrived(len(prompt_token_ids), load_mark)
        self._commands.put(lambda: self._take_in(first))
        remaining = n
        try:
            while remaining:
                output = await outputs.get()
                if output.error is not None:
                    raise EngineError(output.error)
                remaining -= output.finished
                yield output
        finally:
            if remaining:
                seq_ids = [request.seq.seq_id for request in requests]
                self._commands.put(lambda: self._abort_all(seq_ids))

    async def embed(self, token_ids: list[int], adapter: LoRARef | None = None) -> list[float]:
        """The runner's pooled embedding of ``token_ids`` (under ``adapter``), computed on the engine thread between steps."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[list[float]] = loop.create_future()

        def compute() -> None:
            try:
                vector = self.runner.embed(token_ids, adapter.lora_id if adapter is not None else 0)
            except Exception as exc:
                log.exception("embedding failed")
                loop.call_soon_threadsafe(_settle, result, None, EngineError(f"embedding failed: {exc}"))
            else:
                loop.call_soon_threadsafe(_settle, result, vector, None)

        self._commands.put(compute)
        return await result

    async def prompt_logprobs(
        self, token_ids: list[int], top: int, adapter: LoRARef | None = None
    ) -> list[TokenLogprobs | None]:
        """The runner's prompt logprobs (``ModelRunner.prompt_logprobs``), computed on the engine thread between steps."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[list[TokenLogprobs | None]] = loop.create_future()

        def compute() -> None:
            try:
                found = self.runner.prompt_logprobs(token_ids, top, adapter.lora_id if adapter is not None else 0)
            except Exception as exc:
                log.exception("prompt logprobs failed")
                loop.call_soon_threadsafe(_settle, result, None, EngineError(f"prompt logprobs failed: {exc}"))
            else:
                loop.call_soon_threadsafe(_settle, result, found, None)

        self._commands.put(compute)
        return await result

    def reset_prefix_cache(self) -> None:
        self._commands.put(self.block_manager.reset_prefix_cache)

    def unpin_blocks(self, block_ids: list[int]) -> None:
        """Free a KV transfer's held blocks (any thread; done on the engine thread)."""
        self._commands.put(lambda: self.block_manager.unpin(block_ids))

    async def prefix_hit_blocks(
        self, prompt_token_ids: list[int], cache_salt: str | None, adapter: LoRARef | None
    ) -> tuple[int, list[bytes]]:
        """How many leading full blocks of the prompt are cached here now, and the hashes of every
        block a prefix hit could cover (all full blocks before the last token's), for a KV pull."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[tuple[int, list[bytes]]] = loop.create_future()
        block_size = self.block_manager.block_size

        def look() -> None:
            seq = Sequence(
                -1, prompt_token_ids, SamplingParams(), len(prompt_token_ids) + 1, cache_salt, adapter=adapter
            )
            held = self.block_manager.num_prefix_hit_blocks(seq)
            candidates = seq.block_hashes[: (len(prompt_token_ids) - 1) // block_size]
            loop.call_soon_threadsafe(_settle, result, (held, [hash_to_bytes(h) for h in candidates]), None)

        self._commands.put(look)
        return await result

    def request_snapshot(self) -> "Future[Snapshot]":
        """Every block cached now, as events, with the sequence number of the last batch they follow.

        Taken on the engine thread between steps, after publishing the events still pending, so
        the snapshot and the published stream agree; resolves from that thread (any thread may wait).
        """
        result: Future[Snapshot] = Future()

        def take() -> None:
            self._publish_events()
            assert self.publisher is not None
            events: list[KVEvent] = [AllBlocksCleared(), *self.block_manager.snapshot()]
            result.set_result((self.publisher.last_sequence, events))

        self._commands.put(take)
        return result

    def request_ended(self, load_mark: LoadMark | None) -> None:
        """A request is done with this engine, whether or not it reached ``generate``: its sender may
        take it as counted (``protocol/load_mark.py``)."""
        self._load.ended(load_mark)

    def load(self) -> ReplicaLoad:
        """The load now, for the load socket; read from another thread, so only approximately consistent.
        Requests still in the command queue count as waiting (``LoadReading``)."""
        running, waiting, queued_prefill_tokens, arrivals = self._load.now(self._scheduled)
        return ReplicaLoad(
            ts=time.time(),
            running=running,
            waiting=waiting,
            queued_prefill_tokens=queued_prefill_tokens,
            arrivals=arrivals,
            prefix_waits=self._prefix_waits,
            kv_cache_usage=self.block_manager.usage,
            prefill_tokens_per_s=self._prefill_rate.tokens_per_s,
            started_at=self.started_at,
            pending_prefixes=self._take_announced(),
            decodes=self._decodes(),
        )

    def stats(self) -> ReplicaStats:
        """The load plus the cache's size and shape (GET /stats); approximately consistent, like ``load``."""
        block_manager = self.block_manager
        running, waiting, queued_prefill_tokens, arrivals = self._load.now(self._scheduled)
        return ReplicaStats(
            ts=time.time(),
            running=running,
            waiting=waiting,
            queued_prefill_tokens=queued_prefill_tokens,
            arrivals=arrivals,
            prefix_waits=self._prefix_waits,
            kv_cache_usage=block_manager.usage,
            prefill_tokens_per_s=self._prefill_rate.tokens_per_s,
            started_at=self.started_at,
            decodes=self._decodes(),
            block_size=block_manager.block_size,
            num_blocks=block_manager.num_blocks,
            free_blocks=block_manager.num_free_blocks,
            cached_free_blocks=block_manager.num_cached_free_blocks,
            cached_blocks=block_manager.num_cached_blocks,
            num_preemptions=self.scheduler.num_preemptions,
            max_num_seqs=self.scheduler.max_num_seqs,
            max_num_batched_tokens=self.scheduler.max_num_batched_tokens,
            host_blocks=block_manager.host.num_slots,
            host_cached_blocks=len(block_manager.host),
            host_kv_cache_usage=block_manager.host.usage,
            host_hit_blocks=block_manager.num_host_hit_blocks,
            retained_free_blocks=block_manager.num_retained_free_blocks,
        )

    def _decodes(self) -> list[DecodeProgress]:
        """Each request's decode progress, running or queued; ``list`` copies the requests in one step under the GIL."""
        requests = list(self._requests.values())
        progress = (decode_progress(r.seq, r.first_token_time, r.last_token_time) for r in requests)
        return [decode for decode in progress if decode is not None]

    def _run(self) -> None:
        stalled = False
        while self._apply_commands(wait=stalled or not self.scheduler.has_work):
            announced = len(self._announced)
            self._take_load_reading()
            if announced:
                self.on_admitted()
            stalled = False
            if self.scheduler.has_work:
                try:
                    stalled = not self._step()
                except Exception as exc:
                    log.exception("engine step failed; failing every request in flight")
                    self._fail_all(f"engine step failed: {exc}")
            self._publish_events()
            self._take_load_reading()

    def _take_load_reading(self) -> None:
        self._load.record(self.scheduler.queued_prefill_tokens())
        waits = self.scheduler.prefix_waits()
        self._prefix_waits = [
            PrefixWait(hash_to_bytes(block_hash), tokens, requests) for block_hash, (tokens, requests) in waits.items()
        ]

    def _take_announced(self) -> list[list[bytes]]:
        announced = []
        while self._announced:
            announced.append(self._announced.popleft())
        return announced

    def _announce(self, seq: Sequence) -> None:
        """Queue the hashes of the prompt's full blocks for the load socket: blocks about to be cached here."""
        block_manager = self.block_manager
        full_blocks = seq.num_prompt_tokens // block_manager.block_size
        if full_blocks:
            extend_block_hashes(
                seq.block_hashes,
                seq.prompt_token_ids,
                block_manager.block_size,
                block_manager.model_name,
                seq.cache_salt,
                seq.adapter_name,
            )
            self._announced.append([hash_to_bytes(block_hash) for block_hash in seq.block_hashes[:full_blocks]])

    def _apply_commands(self, wait: bool) -> bool:
        """Run queued commands, first waiting for one if ``wait``; False once asked to stop."""
        block = wait
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            if command is None:
                return False
            command()
            block = False

    def _scheduled(self) -> tuple[int, int]:
        return len(self.scheduler.running), len(self.scheduler.waiting)

    def _take_in(self, request: _Request) -> None:
        """A request that arrived through ``generate`` leaves the command queue for the scheduler."""
        with self._load.taking_in(len(request.seq.prompt_token_ids)):
            self._add(request)

    def _add(self, request: _Request) -> None:
        self._requests[request.seq.seq_id] = request
        if request.remote_kv is not None:
            self._add_with_remote_kv(request.seq, request.remote_kv)
        else:
            self.scheduler.add(request.seq)
        if self.announce_prompts:
            self._announce(request.seq)

    def _add_with_remote_kv(self, seq: Sequence, remote: RemoteKV) -> None:
        """Install pulled blocks, then queue the sequence, which hits them as a cached prefix.

        The sequence's local prefix is wanted while blocks are taken (so they evict it last), and
        the installed blocks are held until the queued sequence wants them too."""
        block_manager = self.block_manager
        block_manager.want_prefix(seq)
        taken = block_manager.install_remote(seq, remote.first, remote.count)
        block_manager.release_wants(seq)
        if taken:
            transfers = block_manager.take_transfers()
            if transfers:
                self.runner.transfer(transfers)
            try:
                assert self.kv_io is not None
                rows = [index - remote.first for index, _ in taken]
                self.kv_io.write([block_id for _, block_id in taken], remote.payload, rows)
            except Exception:
                log.exception("installing pulled KV blocks failed; the sequence prefills them locally")
                block_manager.uninstall(taken)
                taken = []
        seq.num_transferred_tokens = len(taken) * block_manager.block_size
        self.scheduler.add(seq)
        block_manager.unpin([block_id for _, block_id in taken])

    def _hold(self, seq: Sequence) -> KVHold | None:
        """Pin a finished prefill leg's prompt blocks (those a decode engine's prefix hit can use:
        every full block before the last token's) and register them with the connector."""
        num_blocks = min((seq.num_prompt_tokens - 1) // self.block_manager.block_size, seq.num_registered_blocks)
        if num_blocks <= 0 or self.on_hold is None:
            return None
        block_ids = seq.block_table[:num_blocks]
        self.block_manager.pin(block_ids)
        transfer_id = self.on_hold(block_ids, [hash_to_bytes(h) for h in seq.block_hashes[:num_blocks]])
        return KVHold(transfer_id, list(block_ids))

    def adapters_in_use(self) -> tuple[list[str], list[str]]:
        """The LoRA adapters of the running and of the waiting sequences, each named once, sorted.
        Read from the scrape thread: the scheduler's queues are copied first (one C call each)."""
        running, waiting = list(self.scheduler.running), list(self.scheduler.waiting)
        return _adapter_names(running), _adapter_names(waiting)

    def _abort_all(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self._abort(seq_id)

    def _abort(self, seq_id: int) -> None:
        request = self._requests.pop(seq_id, None)
        if request is not None:
            self.scheduler.finish(request.seq)
            self.runner.release(seq_id)
            self.metrics.request_finished("abort")

    def _step(self) -> bool:
        """Schedule and compute one step; False if nothing could be scheduled."""
        preemptions_before = self.scheduler.num_preemptions
        step = self.scheduler.schedule()
        self.metrics.num_preemptions.inc(self.scheduler.num_preemptions - preemptions_before)
        started = time.monotonic()
        if step.transfers:
            self.runner.transfer(step.transfers)
        if not step.chunks:
            return False
        for seq in step.seqs:
            request = self._requests[seq.seq_id]
            if request.scheduled_time is None:
                request.scheduled_time = started
        sampled = self.runner.execute(step.chunks)
        now = time.monotonic()
        self._prefill_rate.record(step.num_prefill_tokens, now - started)
        logprobs = self.runner.take_logprobs()
        self.scheduler.postprocess(step, sampled)
        deliveries = [
            self._advance(seq, token_id, now, logprobs.get(seq.seq_id))
            for seq, token_id in zip(step.seqs, sampled, strict=False)
        ]
        if self.check_invariants:
            self.scheduler.assert_invariants()
        ready = [delivery for delivery in deliveries if delivery is not None]
        if ready:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(_deliver, ready)
        return True

    def _publish_events(self) -> None:
        events = self.block_manager.drain_events()
        if self.publisher is not None:
            self.publisher.publish(events)

    def _advance(
        self, seq: Sequence, token_id: int | None, now: float, logprobs: TokenLogprobs | None
    ) -> _Delivery | None:
        request = self._requests[seq.seq_id]
        if not request.cache_lookup_counted:
            request.cache_lookup_counted = True
            self.metrics.prefix_cache_queries.inc(seq.num_prompt_tokens)
            host_hits = seq.num_host_cached_tokens or 0
            remote_hits = min(seq.num_transferred_tokens, (seq.num_cached_tokens or 0) - host_hits)
            self.metrics.prefix_cache_hits.inc((seq.num_cached_tokens or 0) - host_hits - remote_hits)
            self.metrics.external_prefix_cache_queries.inc(seq.num_prompt_tokens)
            self.metrics.external_prefix_cache_hits.inc(host_hits + remote_hits)
            self.metrics.prompt_tokens.inc(seq.num_prompt_tokens)
        if token_id is None:
            return None
        for fork in request.forks:
            self._add(fork)
        request.forks = []
        self._observe_latency(request, now)
        request.detokenizer.add_token(token_id)
        if request.detokenizer.stopped:
            seq.finish_reason = "stop"
        finished = seq.finish_reason is not None
        hold = None
        if seq.finish_reason is not None:
            self._requests.pop(seq.seq_id)
            hold = self._hold(seq) if seq.hold_kv else None
            self.scheduler.finish(seq)
            self.runner.release(seq.seq_id)
            self.metrics.request_finished(seq.finish_reason)
            self.metrics.e2e_latency.observe(now - seq.arrival_time)
        output = RequestOutput(
            text=request.detokenizer.take_delta(final=finished),
            token_ids=[token_id],
            finished=finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens or 0,
            index=request.index,
            logprobs=logprobs,
            times=_times(request, now) if finished else None,
            stop_reason=request.detokenizer.matched,
            kv_hold=hold,
        )
        return request.outputs, output

    def _observe_latency(self, request: _Request, now: float) -> None:
        if request.last_token_time is None:
            request.first_token_time = now
            self.metrics.time_to_first_token.observe(now - request.seq.arrival_time)
        else:
            self.metrics.inter_token_latency.observe(now - request.last_token_time)
        request.last_token_time = now
        self.metrics.generation_tokens.inc()

    def _fail_all(self, message: str) -> None:
        """Finish every request with an error output and start over with an empty batch."""
        failed = []
        for seq_id, request in list(self._requests.items()):
            seq = request.seq
            self.scheduler.finish(seq)
            self.runner.release(seq_id)
            output = RequestOutput(
                "", [], True, "error", seq.num_prompt_tokens, seq.num_output_tokens, 0, message, request.index
            )
            failed.append((request.outputs, output))
        self._requests.clear()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(_deliver, failed)


def _times(request: _Request, finished: float) -> RequestTimes:
    arrival = request.seq.arrival_time
    scheduled = request.scheduled_time or arrival
    return RequestTimes(arrival, scheduled, request.first_token_time or finished, finished)


def _settle(future: "asyncio.Future[Any]", value: Any, error: Exception | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _adapter_names(seqs: list[Sequence]) -> list[str]:
    return sorted({seq.adapter_name for seq in seqs if seq.adapter_name is not None})


def _deliver(outputs: list[_Delivery]) -> None:
    for output_queue, output in outputs:
        output_queue.put_nowait(output)
