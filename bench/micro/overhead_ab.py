"""A/B of the gateway's per-request cost: gateways run from different source trees (or with
different environments) in front of one zero-latency backend, measured in interleaved rounds.

``python -m bench.micro.overhead_ab base=/path/to/old/tree new=.:KVGATE_EVENT_LOOP=asyncio ...``

Each round sends the same sequential chats (the overhead benchmark's 2,048-token prompts: 16
system prompts, a question never sent before) to the backend directly and to every gateway, in
a shuffled order, so a noisy neighbour hurts all of them alike. Every round has its own
questions, so a gateway's caches hold the system prompts but never the question. Reported per gateway: the median over rounds of the added p50 and p99 latency,
and its CPU time per request (user + system, from /proc): the figure least moved by the noise
of a shared machine.
"""

import argparse
import asyncio
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from bench.harness.contenders import MODEL
from bench.harness.processes import REPO, Process, free_port, http_ok, launch, module_command, wait_ready
from bench.micro.overhead import chat_bodies, sequential_latencies, start_sglang
from normalize.chat_tokenizer import ChatTokenizer

WARM_UP = 40
"""Requests each contender gets before the rounds (connections open, system prompts cached)."""


@dataclass
class Contender:
    name: str
    url: str
    pid: int | None
    latencies: list[list[float]] = field(default_factory=list)
    cpu_per_request: list[float] = field(default_factory=list)


def process_cpu_s(pid: int | None) -> float:
    """CPU time of the process's live threads, in ns resolution (``/proc/PID/stat`` counts 10 ms ticks)."""
    if pid is None:
        return 0.0
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total_ns / 1e9


def start_gateway(spec: str, backend_url: str, workdir: Path) -> Process:
    """``NAME=TREE[:VAR=VALUE...]``: a gateway run from TREE with those environment variables."""
    name, rest = spec.split("=", 1)
    tree, *assignments = rest.split(":")
    tree_path = Path(tree).resolve()
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": MODEL,
        "tokenizer": MODEL,
        "backends": [{"name": "zero", "url": backend_url, "kv_capacity_blocks": 1_000_000}],
        "routing": {"policy": "cache_aware"},
    }
    config_path = workdir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(tree_path), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    for assignment in assignments:
        variable, value = assignment.split("=", 1)
        env[variable] = value
    with open(workdir / f"{name}.log", "wb") as log:
        command = [sys.executable, "-m", "gateway.process.cli", "gateway", "-c", str(config_path)]
        proc = subprocess.Popen(
            command, cwd=tree_path, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    gateway = Process(proc, port, workdir / f"{name}.log")
    wait_ready(gateway, lambda: http_ok(f"{gateway.url}/health"), 120)
    return gateway


async def measure(contenders: list[Contender], bodies: list[bytes], rounds: int, per_round: int) -> None:
    for contender in contenders:
        await sequential_latencies(contender.url, bodies[:WARM_UP])
    for index in range(rounds):
        chunk = bodies[WARM_UP + index * per_round :][:per_round]
        for contender in random.Random(index).sample(contenders, len(contenders)):
            before = process_cpu_s(contender.pid)
            contender.latencies.append(await sequential_latencies(contender.url, chunk))
            contender.cpu_per_request.append((process_cpu_s(contender.pid) - before) / len(chunk))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate bench overhead-ab", description=__doc__)
    parser.add_argument("gateways", nargs="+", help="NAME=TREE[:VAR=VALUE...]")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--peers", action="store_true", help="also measure sglang-router (its CPU not counted)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "overhead_ab")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bodies = chat_bodies(ChatTokenizer.load(MODEL), WARM_UP + args.rounds * args.per_round, 2048)
    port = free_port()
    backend = launch(module_command("bench.harness.zero_backend", "--port", str(port)), port, args.out / "zero.log")
    gateways: list[Process] = []
    try:
        wait_ready(backend, lambda: http_ok(f"{backend.url}/health"))
        contenders = [Contender("direct", backend.url, None)]
        for spec in args.gateways:
            gateways.append(start_gateway(spec, backend.url, args.out))
            contenders.append(Contender(spec.split("=", 1)[0], gateways[-1].url, gateways[-1].proc.pid))
        if args.peers:
            gateways.append(start_sglang(backend.url, args.out))
            contenders.append(Contender("sglang-router", gateways[-1].url, gateways[-1].proc.pid))
        load_before = os.getloadavg()[0]
        asyncio.run(measure(contenders, bodies, args.rounds, args.per_round))
    finally:
        for gateway in gateways:
            gateway.stop()
        backend.stop()
    direct_p50 = [np.percentile(round_, 50) for round_ in contenders[0].latencies]
    direct_p99 = [np.percentile(round_, 99) for round_ in contenders[0].latencies]
    print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print("| gateway | added p50 (ms) | added p99 (ms) | CPU per request (us) |\n|---|---|---|---|")
    for contender in contenders[1:]:
        added_p50 = [np.percentile(r, 50) - d for r, d in zip(contender.latencies, direct_p50, strict=True)]
        added_p99 = [np.percentile(r, 99) - d for r, d in zip(contender.latencies, direct_p99, strict=True)]
        cpu_us = np.median(contender.cpu_per_request) * 1e6
        print(
            f"| {contender.name} | {np.median(added_p50) * 1e3:.2f} | {np.median(added_p99) * 1e3:.2f} | {cpu_us:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
