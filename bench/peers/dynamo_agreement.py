"""``kvgate bench dynamo-agreement``: does the model of Dynamo's KV router (bench/sim/dynamo_model.py)
pick the worker the real one picks? (issue 31: each model checked against the real router)

Real ``kvgate engine --sim`` replicas publish their KV events; the real ``dynamo.select_service``
(its own venv, Dynamo's defaults unless ``--dynamo`` sets its cost knobs) has them registered and
follows those events. A window of a Mooncake trace (the token ids ``bench simulate`` and ``bench
run`` make of it) is replayed in trace order, ``--concurrency`` requests in flight (closed loop: the
trace's arrival times are not kept). For each request, one at a time:

1. the views of the caches are given up to ``SETTLE_S`` to agree: Dynamo's ``/overlap_scores`` for
   the prompt against the model's index, which reads the same replicas' events;
2. the model costs every worker (on the reservations it holds, which are Dynamo's: below) and picks
   the lowest, a tie at random; then Dynamo's ``/select_and_reserve`` picks;
3. the model records Dynamo's reservation: Dynamo's pick, with the prefill tokens Dynamo counted;
4. the request goes to Dynamo's pick (streamed), and, as ``bench/peers/dynamo_proxy.py`` does,
   ``prefill_complete`` is reported at its first token and ``DELETE`` at its end, to Dynamo and
   the model at once.

Decisions and reports are taken under one lock, so both routers see the same reservations; only
the KV events reach them on their own. Dynamo's log names the cost (logit) of each pick, which
the model's cost of that worker must reproduce.
"""

import argparse
import asyncio
import contextlib
import dataclasses
import random
import re
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import orjson
import zmq
import zmq.asyncio
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector

from bench.cli import TRACE_FILES, sim_cost_args
from bench.harness.contenders import MODEL, FleetSpec, Replica, dynamo_install_hint, dynamo_python, start_replicas
from bench.harness.processes import REPO
from bench.harness.text_vocab import round_trip_vocab
from bench.peers.dynamo_agreement_report import SETTLE_S, AgreementSummary, Decision
from bench.peers.dynamo_config import DYNAMO_DEFAULTS, DynamoConfig, add_dynamo_argument
from bench.peers.dynamo_proxy import has_token
from bench.peers.dynamo_service import register_worker, start_select_service, worker_registration
from bench.sim.dynamo_model import DynamoKVRouter, lowest
from bench.sim.peer_kv_index import PeerKVIndex
from bench.workloads.trace_replay import TraceReplayParams, generate
from normalize.chat_tokenizer import ChatTokenizer
from radix.hashing import block_hashes, hash_to_bytes
from radix.kv_event_format import (
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
    parse_frames,
    wire_block_hash,
)

SETTLE_POLL_S = 0.01
SUBSCRIBE_S = 0.5
"""Time given to the ZMQ subscriptions (ours and Dynamo's) to connect before the first request."""
REQUEST_TIMEOUT_S = 300.0
SELECTED = re.compile(r'Selected worker .*?request_id="([^"]+)" worker_id=(\d+) .*?logit=(\S+)')
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class AgreementSettings:
    trace_file: Path
    workdir: Path
    start: int = 0
    requests: int = 300
    replicas: int = 4
    concurrency: int = 4
    num_blocks: int = 8192
    block_size: int = 16
    sim_prefill_us: float = 75.0
    max_output_tokens: int = 32
    seed: int = 0
    """Mixed into the trace's token ids, and seeds the model's tie-breaks."""
    dynamo: DynamoConfig = DYNAMO_DEFAULTS
    """The cost knobs, given to the real select_service and to the model alike."""


def run_agreement(settings: AgreementSettings) -> AgreementSummary:
    """Start the replicas and Dynamo, replay the window, and compare every decision."""
    python = dynamo_python()
    if not python.exists():
        raise FileNotFoundError(dynamo_install_hint())
    settings.workdir.mkdir(parents=True, exist_ok=True)
    params = TraceReplayParams(
        trace_file=str(settings.trace_file),
        start=settings.start,
        max_requests=settings.requests,
        max_output_tokens=settings.max_output_tokens,
        seed=settings.seed,
    )
    prompts = [
        (list(r.prompt_ids or ()), r.max_tokens) for r in generate(params, round_trip_vocab(ChatTokenizer.load(MODEL)))
    ]
    fleet = FleetSpec(
        replicas=settings.replicas,
        num_blocks=settings.num_blocks,
        block_size=settings.block_size,
        engine_args=tuple(sim_cost_args(settings.sim_prefill_us * 1e-6)),
    )
    with ExitStack() as stack:
        replicas = start_replicas(fleet, settings.workdir, stack)
        service = start_select_service(python, settings.workdir / "dynamo-select-service.log", settings.dynamo)
        stack.callback(service.stop)
        for worker_id, replica in enumerate(replicas, start=1):
            assert replica.kv_events is not None
            register_worker(
                service.url,
                worker_registration(
                    worker_id, MODEL, replica.url, fleet.block_size, replica.kv_events, replica.kv_events_replay
                ),
            )
        replay = Replay(settings, replicas, service.url)
        decisions = asyncio.run(replay.run(prompts))
        service.stop()
        logits = logged_logits(service.log_path)
    for decision in decisions:
        decision.dynamo_logit = logits.get(decision.selection_id)
    title = (
        f"{settings.trace_file.name} records {settings.start}..{settings.start + len(prompts) - 1}, "
        f"{settings.replicas} replicas, {settings.concurrency} in flight, seed {settings.seed}, "
        f"Dynamo {settings.dynamo.changed() or 'defaults'}"
    )
    errors = [d for d in decisions if d.error]
    notes = [f"{len(errors)} requests failed at the replica, first: {errors[0].error}"] if errors else []
    return AgreementSummary(title, replay.names, decisions, replay.lost_batches, notes)


class Replay:
    """The replay's shared state: the model, its event subscriptions, and the one decision lock."""

    def __init__(self, settings: AgreementSettings, replicas: Sequence[Replica], service_url: str) -> None:
        self.settings = settings
        self.replicas = list(replicas)
        self.names = [f"replica-{index}" for index in range(len(replicas))]
        self.service_url = service_url
        self.model = DynamoKVRouter(self.names, settings.block_size, PeerKVIndex(self.names), config=settings.dynamo)
        self.rng = random.Random(settings.seed)
        self.lost_batches = 0
        self._lock = asyncio.Lock()

    async def run(self, prompts: list[tuple[list[int], int]]) -> list[Decision]:
        subscribers = [
            asyncio.create_task(self._follow(name, replica))
            for name, replica in zip(self.names, self.replicas, strict=True)
        ]
        await asyncio.sleep(SUBSCRIBE_S)
        decisions: list[Decision] = []
        pending = iter(enumerate(prompts))
        async with ClientSession(connector=TCPConnector(limit=0)) as session:

            async def client() -> None:
                for index, (prompt, max_tokens) in pending:
                    decisions.append(await self._one(session, index, prompt, max_tokens))

            try:
                await asyncio.gather(*(client() for _ in range(self.settings.concurrency)))
            finally:
                for subscriber in subscribers:
                    subscriber.cancel()
                failures = await asyncio.gather(*subscribers, return_exceptions=True)
        for failure in failures:
            if isinstance(failure, Exception):
                raise RuntimeError("a KV event subscription failed") from failure
        return sorted(decisions, key=lambda decision: decision.index)

    async def _follow(self, name: str, replica: Replica) -> None:
        """Apply one replica's KV events to the model's index, counting sequence gaps."""
        assert replica.kv_events is not None
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(replica.kv_events)
        expected = 0
        try:
            while True:
                sequence, batch = parse_frames(await socket.recv_multipart())
                self.lost_batches += max(sequence - expected, 0)
                expected = sequence + 1
                self.model.index.apply(name, [index_keys(event) for event in batch.events])
        finally:
            socket.close()

    async def _one(self, session: ClientSession, index: int, prompt: list[int], max_tokens: int) -> Decision:
        selection_id = f"agree-{index}"
        hashes = [wire_block_hash(h) for h in block_hashes(prompt, self.settings.block_size, MODEL)]
        async with self._lock:
            dynamo_overlap, polls = await self._settled_overlap(session, prompt, hashes)
            model_overlap = self.model.index.prefix_blocks(hashes)
            costs = self.model.costs(hashes, len(prompt))
            tied = lowest(costs)
            picked = tied[0] if len(tied) == 1 else self.rng.choice(tied)
            on_dynamo_view = self.model.costs(hashes, len(prompt), dynamo_overlap)
            answer = await self._post(
                session,
                "/select_and_reserve",
                {"selection_id": selection_id, "model_name": MODEL, "token_ids": prompt, "isl_tokens": len(prompt)},
            )
            real = self.names[int(answer["worker_id"]) - 1]
            prefill_tokens = int(answer["effective_prefill_tokens"])
            self.model.reserve(selection_id, real, hashes, prefill_tokens)
        own_prefill_tokens = max(len(prompt) - model_overlap[real] * self.settings.block_size, 0)
        decision = Decision(
            index,
            selection_id,
            len(prompt),
            real,
            picked,
            costs,
            on_dynamo_view,
            model_overlap,
            dynamo_overlap,
            prefill_tokens=(own_prefill_tokens, prefill_tokens),
            overlap_polls=polls,
        )
        try:
            await self._serve(session, decision, str(answer["endpoint"]), prompt, max_tokens)
        finally:
            async with self._lock:
                await self._report(session, "DELETE", f"/reservations/{selection_id}")
                self.model.finished(selection_id)
        return decision

    async def _settled_overlap(
        self, session: ClientSession, prompt: list[int], hashes: list[int]
    ) -> tuple[dict[str, int], int]:
        """Dynamo's overlap per worker, once it equals the model's (or ``SETTLE_S`` has passed), and
        how many times it was asked."""
        deadline = time.monotonic() + SETTLE_S
        polls = 0
        while True:
            answer = await self._post(session, "/overlap_scores", {"model_name": MODEL, "token_ids": prompt})
            polls += 1
            held = {int(worker["worker_id"]): int(worker["device_blocks"]) for worker in answer["workers"]}
            overlap = {name: held.get(worker_id, 0) for worker_id, name in enumerate(self.names, start=1)}
            if overlap == self.model.index.prefix_blocks(hashes) or time.monotonic() >= deadline:
                return overlap, polls
            await asyncio.sleep(SETTLE_POLL_S)

    async def _serve(
        self, session: ClientSession, decision: Decision, endpoint: str, prompt: list[int], max_tokens: int
    ) -> None:
        """Stream the request from Dynamo's pick; its first token ends its prefill for both routers."""
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            await self._stream(session, decision, f"{endpoint}/v1/completions", body)
        except (TimeoutError, ClientError) as exc:
            decision.error = repr(exc)

    async def _stream(self, session: ClientSession, decision: Decision, url: str, body: dict[str, object]) -> None:
        timeout = ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with session.post(url, json=body, timeout=timeout) as response:
            if response.status != 200:
                decision.error = f"{response.status}: {(await response.read())[:200]!r}"
                return
            prefilled = False
            async for line in response.content:
                if not prefilled and has_token(line):
                    prefilled = True
                    async with self._lock:
                        await self._report(session, "POST", f"/reservations/{decision.selection_id}/prefill_complete")
                        self.model.first_token(decision.selection_id)
                if decision.cached_tokens is None:
                    decision.cached_tokens = cached_tokens(line)

    async def _post(self, session: ClientSession, path: str, body: dict[str, object]) -> dict:
        async with session.post(f"{self.service_url}{path}", json=body, timeout=ClientTimeout(total=10)) as reply:
            text = await reply.read()
            if reply.status != 200:
                raise RuntimeError(f"select_service {path} answered {reply.status}: {text[:300]!r}")
            answer = orjson.loads(text)
            assert isinstance(answer, dict)
            return answer

    async def _report(self, session: ClientSession, method: str, path: str) -> None:
        async with session.request(method, f"{self.service_url}{path}", timeout=ClientTimeout(total=10)) as reply:
            await reply.read()
            if reply.status >= 300:
                raise RuntimeError(f"select_service {method} {path} answered {reply.status}")


def index_keys(event: KVEvent) -> KVEvent:
    """The event with its hashes as the model's index keys them: the engine publishes vLLM's 64-bit
    cut of each hash (``wire_block_hash``), which the model asks for as 16 bytes (``hash_to_bytes``)."""
    if isinstance(event, BlockStored | BlockRemoved):
        keys: list[ExternalBlockHash] = [hash_to_bytes(wire_block_hash(h)) for h in event.block_hashes]
        return dataclasses.replace(event, block_hashes=keys)
    return event


def cached_tokens(line: bytes) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of the streamed chunk that carries usage."""
    if not line.startswith(b"data:") or b'"usage"' not in line:
        return None
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        usage = orjson.loads(line[5:].strip()).get("usage")
        if isinstance(usage, dict):
            return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return None


def logged_logits(log_path: Path) -> dict[str, float]:
    """The cost select_service logged for each pick, by selection id."""
    text = ANSI.sub("", log_path.read_text(errors="replace"))
    return {match[1]: float(match[3]) for match in SELECTED.finditer(text)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate bench dynamo-agreement", description=__doc__.splitlines()[0])
    parser.add_argument("--trace", choices=sorted(TRACE_FILES), default="conversation")
    parser.add_argument("--trace-dir", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--start", type=int, default=0, help="first record of the window (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=300, help="records in the window (default: %(default)s)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (default: %(default)s)")
    parser.add_argument("--num-blocks", type=int, default=8192, help="KV blocks per replica (default: %(default)s)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--sim-prefill-us", type=float, default=75.0, help="prefill cost per token, as bench run (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    add_dynamo_argument(parser, repeatable=False)
    parser.add_argument("--out", type=Path, help="report folder (default: bench/out/dynamo-agreement/TRACE-START)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    trace = args.trace_dir / TRACE_FILES[args.trace]
    if not trace.is_file():
        print(f"skipping: {trace} not found (pass --trace-dir DIR holding {TRACE_FILES[args.trace]})")
        return 0
    if not dynamo_python().exists():
        print(dynamo_install_hint())
        return 2
    out = args.out or REPO / "bench" / "out" / "dynamo-agreement" / f"{args.trace}-{args.start}"
    settings = AgreementSettings(
        trace_file=trace,
        workdir=out,
        start=args.start,
        requests=args.requests,
        replicas=args.replicas,
        concurrency=args.concurrency,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        sim_prefill_us=args.sim_prefill_us,
        seed=args.seed,
        dynamo=args.dynamo or DYNAMO_DEFAULTS,
    )
    started = time.monotonic()
    summary = run_agreement(settings)
    report = summary.markdown() + f"\n({time.monotonic() - started:.0f} s)\n"
    (out / "report.md").write_text(report)
    (out / "decisions.jsonl").write_bytes(
        b"".join(orjson.dumps({**dataclasses.asdict(d), "cause": d.cause}) + b"\n" for d in summary.decisions)
    )
    print(report)
    print(f"report: {out}/report.md, decisions.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
