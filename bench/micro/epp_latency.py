"""The endpoint picker's added latency per request, beside the HTTP gateway's, and its picks per second.

``kvgate bench epp-latency [--sizes 1000,10000,100000] [--requests N]``: one zero-latency backend
(bench/harness/zero_backend.py), one `kvgate gateway` and one `kvgate epp` on the same config, both pinned
to CPU 0 (``taskset``) so "one core" means one core (``--workers N``: each front N worker processes
on CPUs 0 to N-1, the client on them too where the host has no more). For each prompt size, chat requests (16
system prompts of that size, fresh questions: bench/micro/overhead.py's bodies) are sent one at a time:

- direct to the backend, and through the HTTP gateway: the gateway's added latency is its
  percentile minus the direct one (as ``bench overhead`` reports it);
- through the picker as Envoy drives it in BUFFERED mode (tests/epp/envoy_sequences.py): request
  headers, the whole body, then the backend's answer as response headers and one body chunk. The
  picker's added latency is the time Envoy waits on it: the pick (headers sent to pick answered)
  plus the two response-phase round trips. Envoy's own work is not in it; our Python gRPC
  client's is, so it is an upper bound on the picker's share.

Then, with ``--concurrent-tokens``, GIE#2928's case (220 KB prompts, 20 in flight):
``--latency-concurrency`` requests at once through the same three fronts, each request's latency
under that concurrency, three times: GIE#2928's own body on every request (220,000 characters of
one sentence; its benchmark sends nothing else), then every request with one long system prompt
(``--concurrent-tokens``) and a fresh question (an agent's context), then every prompt distinct, so
each is normalized and tokenized cold (kvgate's worst case: GIE's picker hashes bytes and never
tokenizes).

Then picks per second: ``--concurrency`` streams doing the whole sequence with the smallest size
for ``--seconds``; the picker has one core, the client (a Python process) shares the other, so
this is a lower bound. The core's own rate, without gRPC, is measured in this process too.
"""

import argparse
import asyncio
import os
import shutil
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import grpc
import numpy as np
import orjson
import yaml
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpBody, HttpHeaders, ProcessingRequest
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from multidict import CIMultiDict, CIMultiDictProxy

from bench.harness.contenders import MODEL
from bench.harness.processes import (
    REPO,
    Process,
    free_port,
    http_body,
    http_ok,
    kvgate_command,
    launch,
    module_command,
    wait_ready,
)
from bench.micro.overhead import chat_bodies, concurrent_latencies, sequential_latencies
from gateway.backends.proxy import UpstreamOutcome
from gateway.config import load_config
from gateway.epp.pick import pick
from gateway.wiring.state import Gateway
from normalize.chat_tokenizer import ChatTokenizer
from protocol.startup_heap import freeze_startup_objects

ANSWER = orjson.dumps(
    {
        "id": "cmpl-zero",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 1, "total_tokens": 1001},
    }
)
"""The answer the picker's response phase reads (the zero backend's shape)."""


@dataclass(frozen=True)
class LatencyRow:
    prompt_tokens: int
    direct_p50_ms: float
    gateway_added_p50_ms: float
    gateway_added_p99_ms: float
    epp_pick_p50_ms: float
    epp_pick_p99_ms: float
    epp_added_p50_ms: float
    epp_added_p99_ms: float


def _headers(pairs: dict[str, str]) -> HttpHeaders:
    return HttpHeaders(headers=HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]))


def _request_headers(body: bytes) -> ProcessingRequest:
    return ProcessingRequest(
        request_headers=_headers(
            {
                ":path": "/v1/chat/completions",
                ":method": "POST",
                "content-type": "application/json",
                "content-length": str(len(body)),
            }
        )
    )


async def epp_request(stub: ExternalProcessorStub, body: bytes) -> tuple[float, float]:
    """One request through the picker as Envoy sends it (BUFFERED); (pick s, picker's total added s)."""
    call = stub.Process()
    started = time.perf_counter()
    await call.write(_request_headers(body))
    await call.read()
    waited = time.perf_counter() - started
    sent_body = time.perf_counter()
    await call.write(ProcessingRequest(request_body=HttpBody(body=body, end_of_stream=True)))
    answer = await call.read()
    assert answer.HasField("request_body"), answer
    pick = waited + time.perf_counter() - sent_body
    response_started = time.perf_counter()
    status = {":status": "200", "content-type": "application/json"}
    await call.write(ProcessingRequest(response_headers=_headers(status)))
    await call.read()
    await call.write(ProcessingRequest(response_body=HttpBody(body=ANSWER, end_of_stream=True)))
    await call.read()
    added = pick + time.perf_counter() - response_started
    await call.done_writing()
    return pick, added


async def epp_latencies(target: str, bodies: Sequence[bytes]) -> tuple[list[float], list[float]]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = ExternalProcessorStub(channel)
        for body in bodies[:5]:
            await epp_request(stub, body)
        picks, added = [], []
        for body in bodies:
            pick, total = await epp_request(stub, body)
            picks.append(pick)
            added.append(total)
        return picks, added


async def concurrent_epp_latencies(
    target: str, bodies: Sequence[bytes], concurrency: int, connections: int = 1, warm: Sequence[bytes] = ()
) -> tuple[list[float], list[float]]:
    """Each request's pick and added time through the picker with ``concurrency`` streams at once,
    spread over ``connections`` TCP connections (as Envoy's worker threads each hold one; the
    kernel gives each connection to one picker worker); ``warm`` goes first on the same
    connections, not measured."""
    semaphore = asyncio.Semaphore(concurrency)
    async with AsyncExitStack() as stack:
        stubs = [
            ExternalProcessorStub(
                await stack.enter_async_context(
                    grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                )
            )
            for _ in range(connections)
        ]

        async def one(index: int, body: bytes) -> tuple[float, float]:
            async with semaphore:
                return await epp_request(stubs[index % connections], body)

        await asyncio.gather(*(one(index, body) for index, body in enumerate(warm)))
        timings = await asyncio.gather(*(one(index, body) for index, body in enumerate(bodies)))
    return [pick for pick, _ in timings], [added for _, added in timings]


async def picks_per_second(target: str, bodies: Sequence[bytes], concurrency: int, seconds: float) -> float:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = ExternalProcessorStub(channel)
        done = 0
        deadline = time.perf_counter() + seconds

        async def client(offset: int) -> None:
            nonlocal done
            index = offset
            while time.perf_counter() < deadline:
                await epp_request(stub, bodies[index % len(bodies)])
                done += 1
                index += concurrency

        started = time.perf_counter()
        await asyncio.gather(*(client(offset) for offset in range(concurrency)))
        return done / (time.perf_counter() - started)


async def in_process_picks_per_second(config_path: Path, bodies: Sequence[bytes], seconds: float) -> float:
    """Picks per second of the picker's core alone, no gRPC: ``pick`` then ``settle`` (with a whole
    answer's outcome) back to back on this process's event loop, pinned to CPU 0. What start-up built
    is frozen out of the collector's full collections, as the picker's process does (without it,
    a full collection walks this process's every import and one pick in tens takes milliseconds)."""
    gateway = Gateway.build(load_config(str(config_path)))
    await gateway.start()
    freeze_startup_objects()
    affinity = os.sched_getaffinity(0)
    try:
        while not any(backend.healthy for backend in gateway.pool.backends.values()):
            await asyncio.sleep(0.05)
        headers = CIMultiDictProxy(CIMultiDict({":path": "/v1/chat/completions", ":method": "POST"}))
        os.sched_setaffinity(0, {0})
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            chosen = await pick(gateway, headers, bodies[done % len(bodies)], None, 0, f"req-{done}")
            chosen.sent()
            await chosen.settle(UpstreamOutcome(status=200, first_token_at=time.perf_counter(), completed=True))
            done += 1
        return done / (time.perf_counter() - started)
    finally:
        os.sched_setaffinity(0, affinity)
        await gateway.stop()


def _pinned(command: list[str], cpus: int = 1) -> list[str]:
    """``command`` on CPUs 0 to ``cpus - 1`` alone, where taskset exists."""
    return ["taskset", "-c", f"0-{cpus - 1}", *command] if shutil.which("taskset") else command


def start_fronts(backend_url: str, workdir: Path, workers: int = 1) -> tuple[Process, Process, str, Path]:
    """The HTTP gateway and the picker on one config; (gateway, picker, picker's gRPC target, config)."""
    gateway_port, grpc_port, health_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": gateway_port},
        "model": MODEL,
        "tokenizer": MODEL,
        "backends": [{"name": "zero", "url": backend_url, "kv_capacity_blocks": 1_000_000}],
        "routing": {"policy": "cache_aware"},
        "observability": {"request_log_path": str(workdir / "requests.log")},
    }
    config_path = workdir / "epp-latency.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    gateway_command = kvgate_command("gateway", "-c", str(config_path), "--workers", str(workers))
    gateway = launch(_pinned(gateway_command, workers), gateway_port, workdir / "gateway.log")
    epp_command = kvgate_command(
        "epp", "-c", str(config_path), "--host", "127.0.0.1", "--grpc-port", str(grpc_port),
        "--health-port", str(health_port), "--metrics-port", str(metrics_port), "--workers", str(workers),
    )  # fmt: skip
    picker = launch(_pinned(epp_command, workers), metrics_port, workdir / "epp.log")
    wait_ready(gateway, lambda: http_ok(f"{gateway.url}/health"))
    wait_ready(picker, lambda: _backend_healthy(picker.url))
    return gateway, picker, f"127.0.0.1:{grpc_port}", config_path


def _backend_healthy(url: str) -> bool:
    """The picker is up and sees the backend healthy (its /admin/backends, on loopback)."""
    return b'"healthy":true' in (http_body(f"{url}/admin/backends") or b"")


async def _answers_200(url: str, body: bytes) -> None:
    """A measured front must really answer: a refusal would be fast and wrong."""
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/chat/completions", data=body) as reply:
        assert reply.status == 200, await reply.text()


def latency_row(
    size: int, direct: Sequence[float], gateway: Sequence[float], picks: Sequence[float], added: Sequence[float]
) -> LatencyRow:
    """One table row from the latencies in seconds; the gateway's added latency is its percentile
    minus the direct one (as ``bench overhead`` reports it)."""
    d50, d99, g50, g99, p50, p99, a50, a99 = (
        float(value) * 1000.0 for series in (direct, gateway, picks, added) for value in np.percentile(series, [50, 99])
    )
    return LatencyRow(size, d50, g50 - d50, g99 - d99, p50, p99, a50, a99)


def markdown_table(rows: Sequence[LatencyRow]) -> str:
    lines = [
        "| prompt tokens | direct p50 ms | gateway added p50 / p99 ms | EPP pick p50 / p99 ms | EPP added p50 / p99 ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {row.prompt_tokens:,} | {row.direct_p50_ms:.2f} | {row.gateway_added_p50_ms:.2f} / "
        f"{row.gateway_added_p99_ms:.2f} | {row.epp_pick_p50_ms:.2f} / {row.epp_pick_p99_ms:.2f} | "
        f"{row.epp_added_p50_ms:.2f} / {row.epp_added_p99_ms:.2f} |"
        for row in rows
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvgate bench epp-latency", description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,100000", help="prompt tokens, comma-separated")
    parser.add_argument("--requests", type=int, default=100, help="sequential requests per size and front")
    parser.add_argument("--concurrency", type=int, default=32, help="streams for picks per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the picks-per-second run")
    parser.add_argument(
        "--concurrent-tokens", type=int, default=0, help="prompt tokens of the concurrent distinct-prompt run (0: none)"
    )
    parser.add_argument("--concurrent-requests", type=int, default=100, help="requests per front in that run")
    parser.add_argument("--latency-concurrency", type=int, default=20, help="requests in flight at once in that run")
    parser.add_argument("--workers", type=int, default=1, help="processes per front, on as many CPUs")
    parser.add_argument(
        "--connections", type=int, default=1, help="gRPC connections of the concurrent run (Envoy: one a worker thread)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "epp-latency")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = [int(size) for size in args.sizes.split(",")]
    tokenizer = ChatTokenizer.load(MODEL)
    port = free_port()
    backend = launch(module_command("bench.harness.zero_backend", "--port", str(port)), port, args.out / "zero.log")
    try:
        wait_ready(backend, lambda: http_ok(f"{backend.url}/health"))
        gateway, picker, target, config_path = start_fronts(backend.url, args.out, args.workers)
        try:
            rows, rate = asyncio.run(_measure(backend.url, gateway.url, target, tokenizer, sizes, args))
            concurrent = (
                asyncio.run(_measure_concurrent(backend.url, gateway.url, target, tokenizer, args))
                if args.concurrent_tokens
                else None
            )
            smallest = chat_bodies(tokenizer, 256, sizes[0], seed=1)
            core_rate = asyncio.run(in_process_picks_per_second(config_path, smallest, args.seconds))
        finally:
            picker.stop()
            gateway.stop()
    finally:
        backend.stop()
    markdown = "## Endpoint picker added latency (zero-latency backend, sequential requests)\n\n"
    markdown += markdown_table(rows) + f"\n\nPicks per second (one core, {args.concurrency} streams, "
    markdown += f"{sizes[0]:,}-token prompts, through gRPC from a Python client): {rate:,.0f}; "
    markdown += f"the core alone (pick + settle in process, no gRPC, CPU 0): {core_rate:,.0f}\n"
    for (row, kilobytes), kind in zip(concurrent or [], CONCURRENT_KINDS, strict=False):
        markdown += (
            f"\n## At {args.latency_concurrency} in flight, {kind} (about {kilobytes:,.0f} KB a body, "
            f"{args.concurrent_requests} requests per front)\n\n" + markdown_table([row]) + "\n"
        )
    (args.out / "report.md").write_text(markdown)
    report = {
        "rows": [asdict(row) for row in rows],
        "picks_per_s": rate,
        "core_picks_per_s": core_rate,
        "concurrent": {kind: asdict(row) for (row, _), kind in zip(concurrent or [], CONCURRENT_KINDS, strict=False)},
    }
    (args.out / "report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(markdown)
    return 0


async def _measure(
    backend_url: str,
    gateway_url: str,
    target: str,
    tokenizer: ChatTokenizer,
    sizes: Sequence[int],
    args: argparse.Namespace,
) -> tuple[list[LatencyRow], float]:
    rows = []
    for size in sizes:
        print(f"-- {size} tokens", flush=True)
        bodies = chat_bodies(tokenizer, args.requests, size, seed=size)
        await _answers_200(gateway_url, bodies[0])
        direct = await sequential_latencies(backend_url, bodies)
        await sequential_latencies(gateway_url, bodies[:5])
        through_gateway = await sequential_latencies(gateway_url, bodies)
        picks, epp_added = await epp_latencies(target, bodies)
        rows.append(latency_row(size, direct, through_gateway, picks, epp_added))
    smallest = chat_bodies(tokenizer, 256, sizes[0], seed=1)
    rate = await picks_per_second(target, smallest, args.concurrency, args.seconds)
    return rows, rate


CONCURRENT_KINDS = (
    "one identical body (GIE#2928's own)",
    "one shared system prompt, fresh questions",
    "every prompt distinct",
)
GIE_INPUT_CHARS = 220_000
"""The user message of GIE#2928's benchmark: its epp-bench (yankay/gateway-api-inference-extension,
bench/epp-bench/main.go) sends one body every time, a short system prompt and this many characters
of one English sentence repeated."""


def gie_body(chars: int = GIE_INPUT_CHARS) -> bytes:
    """The body GIE#2928's benchmark sends on every request (its ``buildChatCompletionsBody``)."""
    sentence = "The quick brown fox jumps over the lazy dog. "
    user = (sentence * (chars // len(sentence) + 1))[:chars]
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": user}]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 1, "stream": False})


def concurrent_bodies(tokenizer: ChatTokenizer, kind: str, count: int, size: int, front: int) -> list[bytes]:
    """``count`` bodies of one kind (CONCURRENT_KINDS) for one front; each front gets its own texts
    (but GIE's, which is the same everywhere, as in its benchmark)."""
    if kind == CONCURRENT_KINDS[0]:
        return [gie_body()] * count
    systems = 1 if kind == CONCURRENT_KINDS[1] else count
    return chat_bodies(tokenizer, count, size, seed=size + front, distinct_systems=systems)


async def _measure_concurrent(
    backend_url: str, gateway_url: str, target: str, tokenizer: ChatTokenizer, args: argparse.Namespace
) -> list[tuple[LatencyRow, float]]:
    """GIE#2928's case at ``--latency-concurrency``: per kind of prompts (CONCURRENT_KINDS), the row
    and the mean KB of a body. Each front first gets a wave of as many more bodies of the kind at
    once, unmeasured, on the connections the measured requests then use (as a data plane's are
    long-lived; unwarmed, the slowest of 100 requests were the first wave's connection set-up),
    then the bodies it has not seen: those share the system prompt, or share nothing."""
    size, count, concurrency = args.concurrent_tokens, args.concurrent_requests, args.latency_concurrency
    measured = []
    for kind in CONCURRENT_KINDS:
        print(f"-- {size} tokens, {concurrency} in flight, {kind}", flush=True)
        bodies = [concurrent_bodies(tokenizer, kind, count + concurrency, size, front) for front in range(3)]
        await _answers_200(gateway_url, bodies[1][-1])
        fronts, warm = [front[:count] for front in bodies], [front[count:] for front in bodies]
        direct = await concurrent_latencies(backend_url, fronts[0], concurrency, warm[0])
        through_gateway = await concurrent_latencies(gateway_url, fronts[1], concurrency, warm[1])
        picks, epp_added = await concurrent_epp_latencies(target, fronts[2], concurrency, args.connections, warm[2])
        row = latency_row(size, direct, through_gateway, picks, epp_added)
        measured.append((row, float(np.mean([len(body) for body in fronts[2]])) / 1000.0))
    return measured
