"""Gateway throughput: kvgate with 1 and 2 workers, and sglang-router, in front of a zero-latency
backend, driven by wrk (a compiled load generator, so it is not the bottleneck).

``kvgate bench throughput [--peers]`` (or ``python -m bench.throughput``). wrk is closed-loop: for
each target it runs a warm-up step (every worker tokenizes the system prompts once), then steps
of ``--step-s`` seconds at 2, 4, ... 64 open keep-alive connections. Requests are the overhead
benchmark's 2,048-token chats (16 system prompts, fresh questions), POSTed by a Lua script.

The backend is nginx answering a fixed completion (``bench/nginx_backend.py``; a few us of CPU
a request) when nginx is installed, else the Python zero backend (~100 us a request, on the
same cores as the gateway: it caps what two workers can show on a 2-core host).

Besides the rates, every step measures the CPU each process tree spent (``/proc`` schedstat):
the gateway (each worker apart), the backend and wrk, per request. On a shared host the rates
move with the neighbours' load; the CPU per request hardly does, and it gives the ceiling an
idle host would allow: ``min(workers / G, cores / (G + B + W))`` for a gateway costing G per
request in front of a backend costing B, driven by wrk costing W.
"""

import argparse
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

from bench.contenders import MODEL, SGLANG_POLICIES, sglang_install_hint, sglang_router_binary
from bench.nginx_backend import nginx_backend, nginx_binary
from bench.overhead import chat_bodies
from bench.proc_cpu import cpu_ns, descendants, environ
from bench.processes import (
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
from bench.wrk import Step, lua_script, run_wrk
from gateway.workers.identity import WORKER_ENV
from normalize.chat_tokenizer import ChatTokenizer

CONNECTIONS = (2, 4, 8, 16, 32, 64)
IDLE_S = 3.0
"""How long each gateway is watched idle, before any request, for its background CPU."""


@dataclass
class Measured:
    """One step and the CPU each side spent in it (seconds)."""

    step: Step
    gateway_s: float
    worker_s: dict[str, float]
    backend_s: float
    worker_connections: dict[str, int] = field(default_factory=dict)
    """Client connections each worker held (``ss``, a fifth into the step)."""


@dataclass
class Result:
    name: str
    workers: int
    load_before: float
    idle_cpu_per_s: dict[str, float] = field(default_factory=dict)
    """Each gateway worker's background CPU while idle (seconds of CPU per second)."""
    steps: list[Measured] = field(default_factory=list)
    load_after: float = 0.0

    def per_request_us(self, side: str) -> float:
        requests = sum(measured.step.requests for measured in self.steps)
        if side == "wrk":
            spent = sum(measured.step.wrk_cpu_s for measured in self.steps)
        else:
            spent = sum(getattr(measured, f"{side}_s") for measured in self.steps)
        return spent / requests * 1e6 if requests else 0.0

    def ceiling(self, cores: int) -> float:
        """req/s an idle host of ``cores`` would allow, from the CPU each side spent per request."""
        gateway, rest = self.per_request_us("gateway"), self.per_request_us("backend") + self.per_request_us("wrk")
        limits = [cores / (gateway + rest) * 1e6] if gateway + rest else []
        limits += [self.workers / gateway * 1e6] if gateway and self.workers else []
        return min(limits) if limits else 0.0


def gateway_pids(process: Process) -> dict[str, list[int]]:
    """The gateway's processes by worker index ("-": a single-process gateway, or the parent of workers)."""
    pids: dict[str, list[int]] = {}
    for pid in descendants(process.proc.pid):
        pids.setdefault(environ(pid).get(WORKER_ENV, "-").split("/")[0], []).append(pid)
    return pids


def measure_step(
    url: str,
    script: Path,
    connections: int,
    args: argparse.Namespace,
    gateway: dict[str, list[int]],
    backend: list[int],
) -> Measured:
    workers_before = {index: cpu_ns(pids) for index, pids in gateway.items()}
    backend_before = cpu_ns(backend)
    held: dict[str, int] = {}

    def count_connections() -> None:
        by_pid = connections_by_pid(int(url.rsplit(":", 1)[1]))
        held.update({index: sum(by_pid.get(pid, 0) for pid in pids) for index, pids in gateway.items() if index != "-"})

    step = run_wrk(
        url, script, connections, args.step_s, args.wrk_threads, count_connections if len(gateway) > 1 else None
    )
    worker_s = {index: (cpu_ns(pids) - workers_before[index]) / 1e9 for index, pids in gateway.items()}
    return Measured(step, sum(worker_s.values()), worker_s, (cpu_ns(backend) - backend_before) / 1e9, held)


def connections_by_pid(port: int) -> dict[int, int]:
    """Established TCP connections accepted on ``port``, by the pid holding each (``ss -tnp``)."""
    try:
        listing = subprocess.run(
            ["ss", "-tnpH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(Counter(int(pid) for pid in re.findall(r"pid=(\d+)", listing)))


def idle_cpu(gateway: dict[str, list[int]]) -> dict[str, float]:
    before = {index: cpu_ns(pids) for index, pids in gateway.items()}
    time.sleep(IDLE_S)
    return {index: (cpu_ns(pids) - before[index]) / 1e9 / IDLE_S for index, pids in gateway.items()}


def sweep(
    result: Result, url: str, script: Path, args: argparse.Namespace, gateway: Process | None, backend: list[int]
) -> None:
    pids = gateway_pids(gateway) if gateway is not None else {}
    if pids:
        result.idle_cpu_per_s = idle_cpu(pids)
    run_wrk(url, script, 8, args.step_s, args.wrk_threads)
    for connections in args.connections:
        measured = measure_step(url, script, connections, args, pids, backend)
        result.steps.append(measured)
        print(step_line(result.name, measured, args.p99_bound_ms), flush=True)


def step_line(name: str, measured: Measured, bound_ms: float) -> str:
    step = measured.step
    good = step.errors == 0 and step.p99_ms < bound_ms
    requests = max(step.requests, 1)
    line = (
        f"   {name:24s} c={step.connections:3d}: {step.requests_per_s:7.0f} req/s  p50 {step.p50_ms:6.2f}"
        f"  p99 {step.p99_ms:7.2f} ms  err {step.errors}{'' if good else ' (over bound)'}  CPU us/req:"
        f" gateway {measured.gateway_s / requests * 1e6:4.0f} backend {measured.backend_s / requests * 1e6:3.0f}"
        f" wrk {step.wrk_cpu_s / requests * 1e6:3.0f}"
    )
    served = {worker: count for worker, count in step.served_by.items() if worker != "-"}
    if served:
        shares = " ".join(
            f"w{worker} {count / requests:.0%} ({measured.worker_s.get(worker, 0) / max(count, 1) * 1e6:.0f} us,"
            f" {measured.worker_connections.get(worker, '?')} conn)"
            for worker, count in sorted(served.items())
        )
        line += f"  served {shares}"
    spent = measured.gateway_s + measured.backend_s + step.wrk_cpu_s
    return (
        line
        + f"  host share {spent / max(step.duration_s, 1e-9) / (os.cpu_count() or 1):.0%}  load {os.getloadavg()[0]:.1f}"
    )


@contextmanager
def python_backend(workdir: Path, processes: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    command = module_command("bench.zero_backend", "--port", str(port), "--processes", str(processes))
    backend = launch(command, port, workdir / "zero.log")
    try:
        wait_ready(backend, lambda: http_ok(f"{backend.url}/health"))
        yield backend.url, backend.proc.pid
    finally:
        backend.stop()


def zero_backend(workdir: Path, args: argparse.Namespace) -> tuple[str, AbstractContextManager[tuple[str, int]]]:
    """The backend to measure against (its URL and pid, once entered), and a line saying which."""
    if args.backend != "python" and nginx_binary() is not None:
        return "nginx (compiled zero backend, 1 worker process)", nginx_backend(workdir)
    if args.backend == "nginx":
        raise SystemExit("nginx not found (Debian: apt-get install -y nginx-light, or `make bench`)")
    reason = (
        ""
        if args.backend == "python"
        else " -- nginx not found, so the Python one: it takes ~100 us of CPU a request from the same cores"
    )
    return f"Python zero backend ({args.backend_processes} processes){reason}", python_backend(
        workdir, args.backend_processes
    )


def start_kvgate(backend_url: str, workdir: Path, workers: int) -> Process:
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "workers": workers,
        "model": MODEL,
        "tokenizer": MODEL,
        "backends": [{"name": "zero", "url": backend_url, "kv_capacity_blocks": 1_000_000}],
        "routing": {"policy": "cache_aware"},
        "observability": {"request_log": False},
    }
    config_path = workdir / f"kvgate-{workers}w.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    gateway = launch(kvgate_command("gateway", "-c", str(config_path)), port, workdir / f"kvgate-{workers}w.log")
    wait_ready(gateway, lambda: _workers_answering(gateway.url) == workers, 120)
    return gateway


def _workers_answering(url: str) -> int:
    """How many workers sum into /admin/backends (1 for a single-process gateway)."""
    body = http_body(f"{url}/admin/backends")
    return int(orjson.loads(body).get("workers", 1)) if body else 0


def start_sglang(backend_url: str, workdir: Path) -> Process:
    port = free_port()
    command = [str(sglang_router_binary()), "launch", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--worker-urls", backend_url, "--policy", SGLANG_POLICIES[0], "--log-level", "warn"]
    command += ["--prometheus-port", str(free_port())]
    router = launch(command, port, workdir / "sglang-router.log")
    wait_ready(router, lambda: http_ok(f"{router.url}/health"))
    return router


def start_frontend(name: str, backend_url: str, workdir: Path) -> Process | None:
    """The gateway a target name stands for, in front of the backend (None: the backend itself)."""
    if name.startswith("kvgate"):
        return start_kvgate(backend_url, workdir, int(name.rsplit(" ", 1)[1]))
    if name.startswith("sglang"):
        return start_sglang(backend_url, workdir)
    return None


def report(results: list[Result], bound_ms: float, cores: int) -> None:
    print(
        f"\n| target | best req/s, p99 < {bound_ms:g} ms (c) | max req/s (c) | gateway us/req | backend us/req"
        f" | wrk us/req | idle-host ceiling req/s | idle CPU ms/s | load before -> after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for result in results:
        good = [m.step for m in result.steps if m.step.errors == 0 and m.step.p99_ms < bound_ms]
        best = max(good, key=lambda step: step.requests_per_s, default=None)
        top = max((m.step for m in result.steps), key=lambda step: step.requests_per_s, default=None)
        idle = ", ".join(
            f"{'w' + index if index != '-' else 'main'} {share * 1e3:.1f}"
            for index, share in sorted(result.idle_cpu_per_s.items())
        )
        print(
            f"| {result.name} | {_rate(best)} | {_rate(top)} | {result.per_request_us('gateway'):.0f}"
            f" | {result.per_request_us('backend'):.0f} | {result.per_request_us('wrk'):.0f}"
            f" | {result.ceiling(cores):.0f} | {idle or '-'} | {result.load_before:.1f} -> {result.load_after:.1f} |"
        )
    by_workers = {result.workers: result for result in results if result.name.startswith("kvgate")}
    if 1 in by_workers and 2 in by_workers:
        one, two = by_workers[1], by_workers[2]
        print(
            f"\n2 workers / 1 worker: measured {_best(two, bound_ms) / max(_best(one, bound_ms), 1):.2f}x within the bound,"
            f" {_top(two) / max(_top(one), 1):.2f}x at the highest step;"
            f" implied by the CPU per request on an idle {cores}-core host:"
            f" {two.ceiling(cores) / max(one.ceiling(cores), 1):.2f}x"
        )


def _rate(step: Step | None) -> str:
    return f"{step.requests_per_s:.0f} ({step.connections})" if step else "none"


def _best(result: Result, bound_ms: float) -> float:
    rates = [m.step.requests_per_s for m in result.steps if m.step.errors == 0 and m.step.p99_ms < bound_ms]
    return max(rates, default=0.0)


def _top(result: Result) -> float:
    return max((m.step.requests_per_s for m in result.steps), default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate bench throughput", description=__doc__)
    parser.add_argument("--step-s", type=float, default=4.0, help="seconds per wrk step (default: %(default)s)")
    parser.add_argument("--connections", type=int, nargs="+", default=list(CONNECTIONS), help="wrk connection counts")
    parser.add_argument("--p99-bound-ms", type=float, default=50.0)
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument(
        "--backend",
        choices=("auto", "nginx", "python"),
        default="auto",
        help="zero-latency backend: nginx when installed (auto), or the Python one",
    )
    parser.add_argument("--backend-processes", type=int, default=2, help="processes of the Python backend")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="kvgate worker counts to measure")
    parser.add_argument("--peers", action="store_true", help="also measure sglang-router")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "throughput")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk not found; install it (Debian: apt-get install -y wrk)")
        return 2
    if args.peers and not sglang_router_binary().exists():
        print(sglang_install_hint())
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    script = args.out / "chat.lua"
    script.write_text(lua_script(chat_bodies(ChatTokenizer.load(MODEL), 64, 2048)))
    cores = os.cpu_count() or 1
    names = ["direct (zero backend)", *(f"kvgate --workers {workers}" for workers in args.workers)]
    names += [f"sglang-router {SGLANG_POLICIES[0]}"] if args.peers else []
    backend_line, backend = zero_backend(args.out, args)
    print(f"backend: {backend_line}; {cores} cores; load average {os.getloadavg()}", flush=True)
    results: list[Result] = []
    with backend as (backend_url, backend_pid):
        backend_pids = descendants(backend_pid)
        for name in names:
            result = Result(name, _workers_of(name), os.getloadavg()[0])
            frontend = start_frontend(name, backend_url, args.out)
            try:
                sweep(result, frontend.url if frontend else backend_url, script, args, frontend, backend_pids)
            finally:
                if frontend is not None:
                    frontend.stop()
            result.load_after = os.getloadavg()[0]
            results.append(result)
    report(results, args.p99_bound_ms, cores)
    print(f"backend: {backend_line}")
    print(f"load average after the run: {os.getloadavg()}")
    return 0


def _workers_of(name: str) -> int:
    """Gateway processes serving requests: kvgate's worker count, 0 for the backend alone, 1 for sglang-router
    (multi-threaded: its ceiling is the host's cores)."""
    if name.startswith("kvgate"):
        return int(name.rsplit(" ", 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
