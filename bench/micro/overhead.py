"""Gateway overhead: direct vs kvgate vs sglang-router in front of a zero-latency backend.

Sends 2,048-token chat prompts (non-streaming) one at a time to measure latency p50/p99, then
Poisson load at doubling rates, then bisection, to find the highest rate each sustains with p99
under the bound. The load generator shares the machine, so the highest rates are a lower bound.
Added latency is each contender's percentile minus the direct one.
"""

import argparse
import asyncio
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import yaml

from bench.harness.contenders import MODEL, SGLANG_POLICIES, sglang_install_hint, sglang_router_binary
from bench.harness.processes import (
    REPO,
    Process,
    free_port,
    http_ok,
    kvgate_command,
    launch,
    module_command,
    wait_ready,
)
from bench.harness.text_vocab import round_trip_vocab
from bench.workloads.token_blocks import random_tokens
from normalize.chat_tokenizer import ChatTokenizer

MAX_SWEPT_RATE = 12_800.0
"""Past this the load generator itself (one Python process on the same cores) is the limit."""


@dataclass(frozen=True)
class OverheadRow:
    contender: str
    p50_ms: float
    p99_ms: float
    added_p50_ms: float
    added_p99_ms: float
    max_rate_rps: float
    """Highest swept rate with p99 under the bound and no errors (0: none)."""


def chat_bodies(
    tokenizer: ChatTokenizer, count: int, prompt_tokens: int, seed: int = 0, distinct_systems: int = 16
) -> list[bytes]:
    """``count`` chat requests of about ``prompt_tokens`` tokens: ``distinct_systems`` system prompts
    (``count`` of them: no two requests share a prefix), fresh questions."""
    rng = random.Random(seed)
    vocab = round_trip_vocab(tokenizer)
    systems = [tokenizer.decode(random_tokens(rng, prompt_tokens - 48, vocab)) for _ in range(distinct_systems)]
    return [
        orjson.dumps(
            {
                "model": MODEL,
                "max_tokens": 1,
                "messages": [
                    {"role": "system", "content": systems[index % len(systems)]},
                    {"role": "user", "content": tokenizer.decode(random_tokens(rng, 32, vocab))},
                ],
            }
        )
        for index in range(count)
    ]


async def concurrent_latencies(
    url: str, bodies: Sequence[bytes], concurrency: int, warm: Sequence[bytes] = ()
) -> list[float]:
    """Each request's latency with ``concurrency`` in flight at once; ``warm`` is sent first, all at
    once on the same connections and not measured, so the measured requests find them open."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(http: aiohttp.ClientSession, body: bytes) -> float:
        async with semaphore:
            started = time.perf_counter()
            if not await _post(http, url, body):
                raise RuntimeError(f"{url} refused or failed a request: a refusal would be fast and wrong")
            return time.perf_counter() - started

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(one(http, body) for body in warm))
        return list(await asyncio.gather(*(one(http, body) for body in bodies)))


async def sequential_latencies(url: str, bodies: Sequence[bytes]) -> list[float]:
    async with aiohttp.ClientSession() as http:
        latencies = []
        for body in bodies:
            started = time.perf_counter()
            await _post(http, url, body)
            latencies.append(time.perf_counter() - started)
        return latencies


async def poisson_p99(url: str, bodies: Sequence[bytes], rate: float, duration_s: float) -> tuple[float, int]:
    """p99 latency (s) and error count of Poisson traffic at ``rate`` for ``duration_s``.

    Latency counts from each request's scheduled send time, not from when the sender got round
    to it, so a sender or server that falls behind shows up in the p99 (no coordinated omission).
    """
    rng = random.Random(1)
    latencies: list[float] = []
    errors = 0

    async def one(http: aiohttp.ClientSession, body: bytes, due: float) -> None:
        nonlocal errors
        if await _post(http, url, body):
            latencies.append(time.perf_counter() - due)
        else:
            errors += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = []
        started = time.perf_counter()
        next_at = 0.0
        index = 0
        while next_at < duration_s:
            await asyncio.sleep(max(0.0, next_at - (time.perf_counter() - started)))
            tasks.append(asyncio.create_task(one(http, bodies[index % len(bodies)], started + next_at)))
            index += 1
            next_at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    return (float(np.percentile(latencies, 99)) if latencies else float("inf")), errors


async def _post(http: aiohttp.ClientSession, url: str, body: bytes) -> bool:
    try:
        async with http.post(
            f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, OSError):
        return False


async def max_rate(
    url: str, bodies: Sequence[bytes], p99_bound_s: float, start_rate: float, step_s: float, refinements: int = 3
) -> float:
    """Double the rate until p99 breaks the bound, then bisect between the last good and first bad rate."""
    best, worst = 0.0, start_rate
    while worst <= MAX_SWEPT_RATE and await _within_bound(url, bodies, worst, p99_bound_s, step_s):
        best, worst = worst, worst * 2
    for _ in range(refinements if best else 0):
        middle = (best + worst) / 2
        if await _within_bound(url, bodies, middle, p99_bound_s, step_s):
            best = middle
        else:
            worst = middle
    return best


async def _within_bound(url: str, bodies: Sequence[bytes], rate: float, p99_bound_s: float, step_s: float) -> bool:
    p99, errors = await poisson_p99(url, bodies, rate, step_s)
    print(f"   {rate:7.0f} req/s: p99 {p99 * 1000:7.1f} ms, {errors} errors", flush=True)
    return not errors and p99 <= p99_bound_s


@contextmanager
def frontends(backend_url: str, workdir: Path, peers: bool) -> Iterator[dict[str, str]]:
    """Name -> URL of: the backend itself, kvgate in front of it, and sglang-router when ``peers``."""
    with ExitStack() as stack:
        urls = {"direct": backend_url}
        gateway = _start_kvgate(backend_url, workdir)
        stack.callback(gateway.stop)
        urls["kvgate cache_aware"] = gateway.url
        if peers:
            router = start_sglang(backend_url, workdir)
            stack.callback(router.stop)
            urls[f"sglang-router {SGLANG_POLICIES[0]}"] = router.url
        yield urls


def _start_kvgate(backend_url: str, workdir: Path) -> Process:
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": MODEL,
        "tokenizer": MODEL,
        "backends": [{"name": "zero", "url": backend_url, "kv_capacity_blocks": 1_000_000}],
        "routing": {"policy": "cache_aware"},
    }
    config_path = workdir / "kvgate-overhead.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    gateway = launch(kvgate_command("gateway", "-c", str(config_path)), port, workdir / "kvgate.log")
    wait_ready(gateway, lambda: http_ok(f"{gateway.url}/health"))
    return gateway


def start_sglang(backend_url: str, workdir: Path) -> Process:
    port = free_port()
    command = [
        str(sglang_router_binary()),
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        backend_url,
        "--policy",
        SGLANG_POLICIES[0],
        "--log-level",
        "warn",
        "--prometheus-port",
        str(free_port()),
    ]
    router = launch(command, port, workdir / "sglang-router.log")
    wait_ready(router, lambda: http_ok(f"{router.url}/health"))
    return router


def markdown_table(rows: Sequence[OverheadRow], p99_bound_ms: float) -> str:
    lines = [
        f"| contender | latency p50 (ms) | latency p99 (ms) | added p50 (ms) | added p99 (ms) | max req/s with p99 < {p99_bound_ms:g} ms |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {row.contender} | {row.p50_ms:.2f} | {row.p99_ms:.2f} | {row.added_p50_ms:.2f} | {row.added_p99_ms:.2f} | {row.max_rate_rps:g} |"
        for row in rows
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvgate bench overhead", description=__doc__)
    parser.add_argument(
        "--requests", type=int, default=300, help="sequential requests per contender (default: %(default)s)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--p99-bound-ms", type=float, default=50.0)
    parser.add_argument("--start-rate", type=float, default=25.0)
    parser.add_argument(
        "--step-s", type=float, default=3.0, help="seconds of load per swept rate (default: %(default)s)"
    )
    parser.add_argument("--peers", action="store_true", help="also measure sglang-router")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "overhead")
    args = parser.parse_args(argv)
    if args.peers and not sglang_router_binary().exists():
        print(sglang_install_hint())
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    bodies = chat_bodies(ChatTokenizer.load(MODEL), args.requests, args.prompt_tokens)
    port = free_port()
    backend = launch(module_command("bench.harness.zero_backend", "--port", str(port)), port, args.out / "zero.log")
    try:
        wait_ready(backend, lambda: http_ok(f"{backend.url}/health"))
        with frontends(backend.url, args.out, args.peers) as urls:
            rows = asyncio.run(_measure(urls, bodies, args))
    finally:
        backend.stop()
    markdown = f"## Gateway overhead ({args.prompt_tokens}-token chat prompts, zero-latency backend)\n\n"
    markdown += markdown_table(rows, args.p99_bound_ms) + "\n"
    (args.out / "report.md").write_text(markdown)
    (args.out / "report.json").write_bytes(orjson.dumps([asdict(row) for row in rows], option=orjson.OPT_INDENT_2))
    print(markdown)
    return 0


async def _measure(urls: dict[str, str], bodies: Sequence[bytes], args: argparse.Namespace) -> list[OverheadRow]:
    measured: dict[str, tuple[float, float, float]] = {}
    for name, url in urls.items():
        print(f"-- {name}", flush=True)
        await sequential_latencies(url, bodies[:20])
        latencies = await sequential_latencies(url, bodies)
        p50, p99 = np.percentile(latencies, [50, 99])
        rate = await max_rate(url, bodies, args.p99_bound_ms / 1000, args.start_rate, args.step_s)
        measured[name] = (float(p50), float(p99), rate)
    direct_p50, direct_p99, _ = measured["direct"]
    return [
        OverheadRow(name, p50 * 1000, p99 * 1000, (p50 - direct_p50) * 1000, (p99 - direct_p99) * 1000, rate)
        for name, (p50, p99, rate) in measured.items()
    ]
