"""Soak: minutes of mixed load on one gateway over 4 simulated replicas that publish KV events,
with a config reload and a replica killed on the way; reports the worst event-loop lag.

``python -m bench.micro.soak --minutes 10`` (not part of ``make test``). Load is closed-loop: each
client sends its next request when the last one ends, a mix of long-system-prompt chats
(whole and streamed) and fresh token-id completions that churn the replicas' small caches,
so KV events (stores and evictions) flow all the time. Besides the gateway's own lag metric it
measures, from the client side, the longest stretch in which no request completed.

``--gateway-cpus 0`` runs the gateway alone on CPU 0 and everything else on the others, so the
lag measured is the gateway's own, not the clients' and replicas' competing for the same cores.

``--hostile-clients N`` adds N clients that send only hostile requests (bench/micro/hostile_bodies.py:
combining-mark runs, megabytes for the volatile-span regex, flat JSON of millions of values,
hundreds of thousands of keys, logit_bias entries or stop strings, 8 MB of messages), with
volatile spans switched on; their answers are tallied apart.
"""

import argparse
import asyncio
import os
import random
import re
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import yaml

from bench.harness.contenders import MODEL, Contender, FleetSpec, Replica, kvgate_config
from bench.harness.processes import (
    REPO,
    Process,
    free_port,
    http_body,
    http_ok,
    http_post_ok,
    kvgate_command,
    launch,
    wait_ready,
)
from bench.micro.hostile_bodies import hostile_bodies
from bench.micro.overhead import chat_bodies
from normalize.chat_tokenizer import ChatTokenizer

REPLICAS = 4


@dataclass
class Tally:
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    completions: list[float] = field(default_factory=list)
    """perf_counter() when each request ended (ok or not)."""

    def failed(self, why: str) -> None:
        self.errors[why] = self.errors.get(why, 0) + 1


def completion_body(rng: random.Random, vocab_size: int) -> bytes:
    tokens = [rng.randrange(10, vocab_size) for _ in range(rng.randrange(200, 2000))]
    return orjson.dumps({"model": MODEL, "prompt": tokens, "max_tokens": 8})


async def client(url: str, chats: list[bytes], until: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.perf_counter() < until:
            pick = rng.random()
            if pick < 0.25:
                path, body = "/v1/completions", completion_body(rng, 48_000)
            else:
                path, body = "/v1/chat/completions", chats[rng.randrange(len(chats))]
                if pick > 0.75:
                    body = body[:-1] + b',"stream":true,"max_tokens":16}'
            try:
                async with session.post(url + path, data=body, headers={"Content-Type": "application/json"}) as reply:
                    await reply.read()
                    if reply.status == 200:
                        tally.ok += 1
                    else:
                        tally.failed(str(reply.status))
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally.failed(type(exc).__name__)
            tally.completions.append(time.perf_counter())


async def hostile_client(url: str, bodies: list[tuple[str, str, bytes]], until: float, tally: Tally, seed: int) -> None:
    """Sends hostile bodies back to back; tallies each answer's status by the body's name."""
    rng = random.Random(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        while time.perf_counter() < until:
            name, path, body = bodies[rng.randrange(len(bodies))]
            try:
                async with session.post(url + path, data=body, headers={"Content-Type": "application/json"}) as reply:
                    await reply.read()
                    tally.failed(f"{name}: {reply.status}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally.failed(f"{name}: {type(exc).__name__}")


def _health_check(url: str) -> Callable[[], bool]:
    return lambda: http_ok(f"{url}/health")


def longest_gap(times: list[float], start: float, end: float) -> float:
    marks = sorted([start, *times, end])
    return max(later - earlier for earlier, later in zip(marks, marks[1:], strict=False))


def scrape_lag(url: str) -> tuple[float, dict[str, float]]:
    """The gateway's worst lag and its lag histogram's cumulative bucket counts."""
    body = (http_body(f"{url}/metrics") or b"").decode()
    worst = re.search(r"^kvgate_event_loop_lag_max_seconds (\S+)$", body, re.M)
    buckets = dict(re.findall(r'^kvgate_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', body, re.M))
    return (float(worst.group(1)) if worst else float("nan")), {le: float(count) for le, count in buckets.items()}


async def soak(
    url: str, chats: list[bytes], minutes: float, clients: int, events: "Events", hostile: "Hostile"
) -> Tally:
    tally = Tally()
    start = time.perf_counter()
    until = start + minutes * 60
    load = [asyncio.create_task(client(url, chats, until, tally, seed)) for seed in range(clients)]
    load += [
        asyncio.create_task(hostile_client(url, hostile.bodies, until, hostile.tally, seed))
        for seed in range(hostile.clients)
    ]
    await asyncio.sleep(minutes * 60 / 3)
    await asyncio.to_thread(events.reload)
    await asyncio.sleep(minutes * 60 / 6)
    events.kill_replica()
    while time.perf_counter() < until:
        await asyncio.sleep(min(30.0, until - time.perf_counter()))
        worst, _ = scrape_lag(url)
        elapsed = time.perf_counter() - start
        print(f"   {elapsed:5.0f}s: {tally.ok} ok, errors {tally.errors}, worst loop lag {worst:.3f}s", flush=True)
    await asyncio.gather(*load)
    return tally


@dataclass
class Hostile:
    clients: int
    bodies: list[tuple[str, str, bytes]]
    tally: Tally = field(default_factory=Tally)


@dataclass
class Events:
    url: str
    config_path: Path
    config: dict
    victim: Process

    def reload(self) -> None:
        """Change the routing policy and reload (a real config change, applied live)."""
        self.config["routing"] = {**self.config["routing"], "policy": "least_loaded"}
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        print(f"   reload: {'ok' if http_post_ok(f'{self.url}/admin/reload') else 'FAILED'}", flush=True)

    def kill_replica(self) -> None:
        self.victim.proc.kill()
        print(f"   killed the replica on port {self.victim.port}", flush=True)


def start_replicas(fleet: FleetSpec, workdir: Path, stack: ExitStack) -> list[tuple[Process, str]]:
    """Simulated replicas publishing KV events: (process, events endpoint) for each."""
    started = []
    for index in range(fleet.replicas):
        port, events = free_port(), f"tcp://127.0.0.1:{free_port()}"
        command = kvgate_command(
            "engine", "--sim", "--port", str(port), "--kv-events", events, "--log-level", "WARNING"
        )
        command += ["--num-blocks", str(fleet.num_blocks), "--max-model-len", str(fleet.max_model_len)]
        process = launch([*command, *fleet.engine_args], port, workdir / f"replica-{index}.log")
        stack.callback(process.stop)
        started.append((process, events))
    for process, _ in started:
        wait_ready(process, _health_check(process.url))
    return started


def cpu_list(text: str) -> set[int]:
    """``0`` or ``0,2``: CPUs this host has, leaving at least one for the rest."""
    cpus = {int(part) for part in text.split(",")}
    available = os.sched_getaffinity(0)
    if not cpus <= available or cpus == available:
        raise argparse.ArgumentTypeError(f"choose some, not all, of the CPUs {sorted(available)}")
    return cpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate bench soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=12, help="concurrent closed-loop clients")
    parser.add_argument("--num-blocks", type=int, default=1024, help="KV blocks per replica (small: evictions)")
    parser.add_argument("--hostile-clients", type=int, default=0, help="clients sending only hostile requests")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "soak")
    parser.add_argument(
        "--gateway-cpus",
        type=cpu_list,
        help="pin the gateway to these CPUs (e.g. 0) and the replicas and clients to the others, "
        "as in production where they run on other hosts (default: all share every CPU)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.gateway_cpus:
        os.sched_setaffinity(0, os.sched_getaffinity(0) - args.gateway_cpus)
    chats = chat_bodies(ChatTokenizer.load(MODEL), 64, 1800)
    fleet = FleetSpec(REPLICAS, args.num_blocks, engine_args=("--sim-preset", "instant"))
    with ExitStack() as stack:
        started = start_replicas(fleet, args.out, stack)
        replicas = [Replica(process.url, events) for process, events in started]
        port = free_port()
        config = kvgate_config(Contender("kvgate", "cache_aware"), fleet, replicas, port)
        config["observability"] = {"request_log": False, "loop_stall_log_s": 0.05}
        if args.hostile_clients:
            config["normalize"] = {"rules": {"volatile_spans": True}}
        config["health"] = {"interval_s": 1.0}
        config_path = args.out / "kvgate.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        command = kvgate_command("gateway", "-c", str(config_path))
        if args.gateway_cpus:
            command = ["taskset", "-c", ",".join(map(str, sorted(args.gateway_cpus))), *command]
        gateway = launch(command, port, args.out / "kvgate.log")
        stack.callback(gateway.stop)
        wait_ready(gateway, lambda: http_ok(f"{gateway.url}/health"))
        events = Events(gateway.url, config_path, config, started[-1][0])
        began = time.perf_counter()
        hostile = Hostile(args.hostile_clients, hostile_bodies() if args.hostile_clients else [])
        tally = asyncio.run(soak(gateway.url, chats, args.minutes, args.clients, events, hostile))
        ended = time.perf_counter()
        worst, buckets = scrape_lag(gateway.url)
    stalls = [line for line in (args.out / "kvgate.log").read_text(errors="replace").splitlines() if "blocked" in line]
    print(f"\n== soak {args.minutes:g} min, {args.clients} clients, {REPLICAS} replicas (KV events)")
    print(f"   requests ok {tally.ok}, errors {tally.errors}")
    if hostile.clients:
        print(f"   hostile requests ({hostile.clients} clients), answers: {dict(sorted(hostile.tally.errors.items()))}")
    print(f"   worst event-loop lag (gateway metric): {worst:.3f}s; lag histogram {buckets}")
    print(
        f"   longest stretch with no request completing (client side): {longest_gap(tally.completions, began, ended):.3f}s"
    )
    print(f"   stall log lines: {len(stalls)}")
    for line in stalls[:10]:
        print(f"     {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
