"""``kvgate bench pd-itl``: decode ITL of short requests while long prompts arrive, on CPU.

The same requests go through kvgate to two real SmolLM2 engines twice, each time on fresh
engines: aggregated (two ``both`` replicas) and P/D (one ``prefill`` + one ``decode`` replica,
the bundled KV connector on both, ``routing.disaggregation`` as configured, conditional by
default). Short streamed requests arrive steadily; long prompts arrive every few seconds. On the
aggregated pair a long prefill stalls the decodes of the replica it lands on; in P/D it runs on
the prefill replica and the decode replica only pulls its KV. Printed: the short requests' ITL
p50/p99 and TTFT, the long prompts' TTFT, and how many long prompts were split.
"""

import argparse
import asyncio
import os
import random
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.harness.contenders import MODEL
from bench.harness.loadgen import LoadResult, RequestResult, Target, run_load
from bench.harness.processes import Process, free_port, http_ok, kvgate_command, launch, wait_ready
from bench.workloads.types import BenchRequest

CONNECTOR = '{"kv_role": "kv_both"}'
ENGINE_THREADS = max(1, len(os.sched_getaffinity(0)) // 2)
"""Each of the two engines gets half the CPUs: two engines with a thread per CPU each oversubscribe
the cores, and their OpenMP teams then wait on each other (steps of seconds, streams timing out)."""
ENGINE_FLAGS = (
    "--num-blocks", "1024", "--max-model-len", "4096", "--kv-transfer-config", CONNECTOR,
    "--threads", str(ENGINE_THREADS),
)  # fmt: skip
FLEETS = {"aggregated": ("both", "both"), "P/D 1+1": ("prefill", "decode")}


def workload(args: argparse.Namespace) -> list[BenchRequest]:
    """Short prompts every ``--short-every-s``, long ones every ``--long-every-s``; distinct token ids."""
    rng = random.Random(args.seed)

    def prompt(tokens: int) -> tuple[int, ...]:
        return tuple(rng.randrange(1000, 40000) for _ in range(tokens))

    requests = [
        BenchRequest(f"short-{i}", f"short-{i}", i * args.short_every_s, args.short_output, prompt(32), group="short")
        for i in range(int(args.duration_s / args.short_every_s))
    ]
    requests += [
        BenchRequest(f"long-{i}", f"long-{i}", 1.0 + i * args.long_every_s, 8, prompt(args.long_tokens), group="long")
        for i in range(int(args.duration_s / args.long_every_s))
    ]
    return sorted(requests, key=lambda request: request.arrival_s)


def start_fleet(
    stack: ExitStack, folder: Path, roles: tuple[str, str], routing: dict[str, Any]
) -> tuple[Process, list[Process]]:
    """Two fresh engines and a gateway in front of them with these roles; all stop with ``stack``."""
    engines = []
    for index in range(2):
        port = free_port()
        command = kvgate_command("engine", "--port", str(port), *ENGINE_FLAGS)
        engine = launch(command, port, folder / f"engine{index}.log")
        stack.callback(engine.stop)
        engines.append(engine)
    for engine in engines:
        wait_ready(engine, _health(engine.url), 300)
    port = free_port()
    config = {
        "listen": {"port": port},
        "model": MODEL,
        "backends": [
            {"name": f"replica-{index}", "url": engine.url, "role": role}
            for index, (engine, role) in enumerate(zip(engines, roles, strict=True))
        ],
        "health": {"interval_s": 0.5, "timeout_s": 2.0},
        "routing": routing,
    }
    (folder / "gateway.yaml").write_text(yaml.safe_dump(config))
    gateway = launch(kvgate_command("gateway", "-c", str(folder / "gateway.yaml")), port, folder / "gateway.log")
    stack.callback(gateway.stop)
    wait_ready(gateway, _health(gateway.url), 120)
    return gateway, engines


def _health(url: str) -> Callable[[], bool]:
    return lambda: http_ok(f"{url}/health")


def warm_up(engine: Process, long_tokens: int) -> None:
    """A short and a long prompt straight to the engine, so that neither fleet's first long prefill
    pays the engine's first-use costs (kernel set-up for the shape, memory) while others decode."""
    prompts = [tuple(range(2000, 2040)), tuple(range(3000, 3000 + long_tokens))]
    warm = [BenchRequest(f"warm-up-{i}", f"warm-up-{i}", 0.0, 4, prompt) for i, prompt in enumerate(prompts)]
    asyncio.run(run_load(warm, Target((engine.url,), MODEL), label="warm-up"))


def run_fleet(
    name: str, requests: list[BenchRequest], routing: dict[str, Any], folder: Path, long_tokens: int
) -> LoadResult:
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        gateway, engines = start_fleet(stack, folder, FLEETS[name], routing)
        for engine in engines:
            warm_up(engine, long_tokens)
        return asyncio.run(run_load(requests, Target((gateway.url,), MODEL), label=name))


def summary(name: str, load: LoadResult) -> str:
    shorts = [result for result in load.results if result.group == "short" and result.ok]
    longs = [result for result in load.results if result.group == "long" and result.ok]
    gaps = [gap for result in shorts for gap in result.itl_s]
    split = sum(1 for result in longs if _split(result))
    failed = sum(1 for result in load.results if not result.ok)
    return (
        f"| {name} | {_ms(gaps, 50)} | {_ms(gaps, 99)} | {_ms([r.ttft for r in shorts], 50)} | "
        f"{_ms([r.ttft for r in shorts], 99)} | {_ms([r.ttft for r in longs], 50)} | {split}/{len(longs)} | {failed} |"
    )


def _split(result: RequestResult) -> bool:
    return "disaggregated" in (result.route_reason or "") or "pd-split" in (result.route_reason or "")


def _ms(values: list[float], percentile: float) -> str:
    return f"{np.percentile(values, percentile) * 1e3:.0f}" if values else "-"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate bench pd-itl", description=__doc__)
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--short-every-s", type=float, default=0.5)
    parser.add_argument("--short-output", type=int, default=48)
    parser.add_argument("--long-every-s", type=float, default=5.0)
    parser.add_argument("--long-tokens", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=("conditional", "always"), default="conditional", help="P/D decider mode")
    parser.add_argument("--out", type=Path, help="folder for the engines' and gateways' logs (default: a temp dir)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    requests = workload(args)
    shorts = sum(1 for request in requests if request.group == "short")
    print(
        f"# {shorts} short requests (32 tokens, {args.short_output} out) every {args.short_every_s:g} s and "
        f"{len(requests) - shorts} long prompts ({args.long_tokens} tokens, 8 out) every {args.long_every_s:g} s, "
        f"SmolLM2-135M engines on CPU; P/D decider mode {args.mode}",
        flush=True,
    )
    lines = [
        "| fleet | short ITL p50 (ms) | p99 | short TTFT p50 (ms) | p99 | long TTFT p50 (ms) | long split | failed |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="pd-itl-") as scratch:
        base = args.out or Path(scratch)
        for name in FLEETS:
            routing = {"disaggregation": {"mode": args.mode}}
            load = run_fleet(name, requests, routing, base / name.replace("/", "").replace(" ", "-"), args.long_tokens)
            lines.append(summary(name, load))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0
