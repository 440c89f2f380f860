"""Gateway throughput: kvgate with 1 and 2 workers, and sglang-router, in front of a zero-latency
backend, driven by wrk (a compiled load generator, so it is not the bottleneck).

``python -m bench.throughput [--peers]``. wrk is closed-loop: for each target it runs steps of
``--step-s`` seconds at 1, 2, 4, ... open connections and reports the highest throughput of a
step whose p99 latency stays under the bound (after a warm-up step, so every worker has the
system prompts tokenized). Requests are the overhead benchmark's 2,048-token
chats (16 system prompts, fresh questions), POSTed by a Lua script; every request opens no new
connection. The backend runs as several processes on one port so that it is not the limit.
"""

import argparse
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from bench.contenders import MODEL, SGLANG_POLICIES, sglang_install_hint, sglang_router_binary
from bench.overhead import chat_bodies
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
from normalize.chat_tokenizer import ChatTokenizer

CONNECTIONS = (1, 2, 4, 8, 16, 32, 64)
LUA_TEMPLATE = """
local bodies = {{{bodies}}}
local index = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  index = index % #bodies + 1
  return wrk.format(nil, "/v1/chat/completions", nil, bodies[index])
end
"""


@dataclass(frozen=True)
class Step:
    connections: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def lua_script(bodies: Sequence[bytes]) -> str:
    """A wrk script that POSTs ``bodies`` in turn (Lua long strings hold them verbatim)."""
    quoted = ",\n".join(f"[==[{body.decode()}]==]" for body in bodies)
    return LUA_TEMPLATE.format(bodies=quoted)


def run_wrk(url: str, script: Path, connections: int, duration_s: float, threads: int) -> Step:
    command = ["wrk", "-t", str(min(threads, connections)), "-c", str(connections), "-d", f"{duration_s:g}s"]
    command += ["--latency", "-s", str(script), url]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return parse_wrk(output, connections)


def parse_wrk(output: str, connections: int) -> Step:
    """Throughput, p50/p99 and errors (socket errors plus non-2xx answers) from wrk's report."""
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    percentiles = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", output, re.M))
    errors = sum(int(count) for count in re.findall(r"(?:connect|read|write|timeout) (\d+)", output))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors += int(non_2xx.group(1)) if non_2xx else 0
    return Step(connections, rate, _ms(percentiles["50"]), _ms(percentiles["99"]), errors)


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def sweep(name: str, url: str, script: Path, args: argparse.Namespace) -> tuple[Step | None, list[Step]]:
    """A warm-up (every worker tokenizes the system prompts once), then a step at each connection
    count; the best step within the bound."""
    run_wrk(url, script, 8, args.step_s, args.wrk_threads)
    steps: list[Step] = []
    best: Step | None = None
    for connections in CONNECTIONS:
        step = run_wrk(url, script, connections, args.step_s, args.wrk_threads)
        steps.append(step)
        good = step.errors == 0 and step.p99_ms < args.p99_bound_ms
        print(
            f"   {name:28s} c={connections:3d}: {step.requests_per_s:8.0f} req/s  p50 {step.p50_ms:6.2f} ms"
            f"  p99 {step.p99_ms:7.2f} ms  errors {step.errors}{'' if good else '  (over bound)'}  "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        if good and (best is None or step.requests_per_s > best.requests_per_s):
            best = step
    return best, steps


@contextmanager
def zero_backend(workdir: Path, processes: int) -> Iterator[str]:
    port = free_port()
    command = module_command("bench.zero_backend", "--port", str(port), "--processes", str(processes))
    backend = launch(command, port, workdir / "zero.log")
    try:
        wait_ready(backend, lambda: http_ok(f"{backend.url}/health"))
        yield backend.url
    finally:
        backend.stop()


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
    parser.add_argument("--step-s", type=float, default=5.0, help="seconds per wrk step (default: %(default)s)")
    parser.add_argument("--p99-bound-ms", type=float, default=50.0)
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--backend-processes", type=int, default=2)
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
    results: list[tuple[str, Step | None]] = []
    names = ["direct (zero backend)", *(f"kvgate --workers {workers}" for workers in args.workers)]
    names += [f"sglang-router {SGLANG_POLICIES[0]}"] if args.peers else []
    with zero_backend(args.out, args.backend_processes) as backend_url:
        for name in names:
            frontend = start_frontend(name, backend_url, args.out)
            try:
                best, _ = sweep(name, frontend.url if frontend else backend_url, script, args)
            finally:
                if frontend is not None:
                    frontend.stop()
            results.append((name, best))
    print(f"\n| target | highest req/s with p99 < {args.p99_bound_ms:g} ms | connections | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for name, best in results:
        if best is None:
            print(f"| {name} | none | | | |")
        else:
            print(
                f"| {name} | {best.requests_per_s:.0f} | {best.connections} | {best.p50_ms:.2f} | {best.p99_ms:.2f} |"
            )
    print(f"\nload average after the run: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
