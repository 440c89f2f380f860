"""Start and stop real kvgate processes on loopback for tests."""

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.harness.processes import REPO, Process, free_port, http_ok, kvgate_command, launch, wait_ready

__all__ = ["REPO", "ManagedProcess", "free_port", "http", "kvgate_cmd", "start", "start_engine", "start_gateway"]

kvgate_cmd = kvgate_command


class ManagedProcess(Process):
    """A child process serving HTTP on 127.0.0.1:port (see bench/harness/processes.py), plus what tests need."""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the process alone, as a crash would."""
        self.proc.kill()
        self.proc.wait(15)


READY_POLL_S = 0.05
"""How often a starting child is asked whether it is ready: the suite starts some 200 of them, and a
fifth of a second between asks cost each a tenth on average (a connection refused costs ~0.1 ms)."""


def start(
    cmd: list[str], port: int, log_path: Path, ready_path: str = "/health", timeout: float = 180.0
) -> ManagedProcess:
    """Start ``cmd`` in its own process group and wait until GET ready_path answers 200."""
    launched = launch(cmd, port, log_path)
    managed = ManagedProcess(launched.proc, port, log_path)
    wait_ready(managed, lambda: http_ok(f"{managed.url}{ready_path}"), timeout, READY_POLL_S)
    return managed


def start_engine(tmp_path: Path, *flags: str, name: str = "engine") -> ManagedProcess:
    """A bundled engine replica (`kvgate engine`) with the given flags on a free port."""
    port = free_port()
    return start(kvgate_cmd("engine", "--port", str(port), *flags), port, tmp_path / f"{name}-{port}.log")


def start_engines(tmp_path: Path, flags_by_name: dict[str, tuple[str, ...]]) -> dict[str, ManagedProcess]:
    """Several bundled engines started at once (each loads its model in parallel), by name."""
    with ThreadPoolExecutor(len(flags_by_name)) as pool:
        futures = {
            name: pool.submit(start_engine, tmp_path, *flags, name=name) for name, flags in flags_by_name.items()
        }
        return {name: future.result() for name, future in futures.items()}


def start_gateway(tmp_path: Path, config_path: Path, port: int) -> ManagedProcess:
    """A gateway (`kvgate gateway -c FILE`) whose config listens on ``port``."""
    return start(kvgate_cmd("gateway", "-c", str(config_path)), port, tmp_path / f"gateway-{port}.log")


@dataclass
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


def http(
    method: str, url: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None, timeout: float = 60
) -> HttpReply:
    """One plain HTTP call that returns error statuses instead of raising (for bad-input tests)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return HttpReply(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as error:
        return HttpReply(error.code, dict(error.headers), error.read())
