"""Gateway throughput: kvgate with 1 and 2 workers, and sglang-router, in front of a zero-latency
backend, driven by wrk (a compiled load generator, so it is not the bottleneck).

``kvgate bench throughput [--peers]`` (or ``python -m bench.micro.throughput``). All targets start
first (the backend alone, each gateway); their idle CPU is read over a few seconds; after a
warm-up step each (every worker tokenizes the system prompts once), wrk runs closed-loop steps
of ``--step-s`` seconds at 2, 4, ... 64 keep-alive connections, every target in turn at each
count, so that targets are compared on steps run close together on a noisy shared host.
Requests are the overhead benchmark's 2,048-token chats (16 system prompts, fresh questions),
POSTed by a Lua script that also counts which worker answered each.

The backend is nginx answering a fixed completion (``bench/harness/nginx_backend.py``; ~10 us of CPU a
request) when nginx is installed, else the Python zero backend (~100 us a request on the same
cores as the gateway, which caps what two workers can show on a 2-core host); the output says
which. Every step also reads the CPU each process tree spent (``/proc`` schedstat): the
gateway (each worker apart), the backend and wrk; ``bench/micro/throughput_report.py`` turns these
into the ceiling an idle host would allow.
"""

import argparse
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from bench.harness.contenders import MODEL, SGLANG_POLICIES, sglang_install_hint, sglang_router_binary
from bench.harness.nginx_backend import nginx_backend, nginx_binary
from bench.harness.proc_cpu import cpu_ns, descendants, environ
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
from bench.harness.wrk import lua_script, run_wrk
from bench.micro.overhead import chat_bodies
from bench.micro.throughput_report import Measured, Result, report, step_line
from gateway.process.workers.identity import WORKER_ENV
from normalize.chat_tokenizer import ChatTokenizer

CONNECTIONS = (2, 4, 8, 16, 32, 64)
IDLE_S = 3.0
"""How long the gateways are watched idle, before any request, for their background CPU."""


@dataclass
class Target:
    name: str
    url: str
    process: Process | None
    """The gateway (None: the backend itself)."""
    pids: dict[str, list[int]]
    result: Result


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
    backend_s = (cpu_ns(backend) - backend_before) / 1e9
    return Measured(step, sum(worker_s.values()), worker_s, backend_s, held, os.getloadavg()[0])


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


def run_steps(targets: list[Target], script: Path, args: argparse.Namespace, backend: list[int]) -> None:
    """A warm-up step per target, then for each connection count a step of every target in turn
    (the order rotated), so targets compared are measured close together in time."""
    for target in targets:
        run_wrk(target.url, script, 8, args.step_s, args.wrk_threads)
    for round_, connections in enumerate(args.connections):
        shift = round_ % len(targets)
        for target in targets[shift:] + targets[:shift]:
            measured = measure_step(target.url, script, connections, args, target.pids, backend)
            target.result.steps.append(measured)
            print(step_line(target.name, measured, args.p99_bound_ms), flush=True)


@contextmanager
def python_backend(workdir: Path, processes: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    command = module_command("bench.harness.zero_backend", "--port", str(port), "--processes", str(processes))
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
        raise SystemExit("nginx not found (Debian: apt-get install -y nginx-light, or `make bench-tools`)")
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
    with backend as (backend_url, backend_pid), ExitStack() as stack:
        targets = []
        for name in names:
            frontend = start_frontend(name, backend_url, args.out)
            if frontend is not None:
                stack.callback(frontend.stop)
            pids = gateway_pids(frontend) if frontend is not None else {}
            targets.append(
                Target(name, frontend.url if frontend else backend_url, frontend, pids, Result(name, _workers_of(name)))
            )
        print(f"all targets up; load average {os.getloadavg()}", flush=True)
        idle = idle_cpu({f"{index}@{target.name}": pids for target in targets for index, pids in target.pids.items()})
        for target in targets:
            target.result.idle_cpu_per_s = {index: idle[f"{index}@{target.name}"] for index in target.pids}
        run_steps(targets, script, args, descendants(backend_pid))
    results = [target.result for target in targets]
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
