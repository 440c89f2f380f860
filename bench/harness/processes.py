"""Child processes of a benchmark (replicas, gateways, peer routers): start, wait until ready, stop."""

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000
PORT_SHARE = (0, 1)
"""(index, count): this process draws its ports from the index-th of count equal slices of the range
below the ephemeral ports, so test workers running side by side (pytest-xdist, tests/conftest.py)
never hand out the same port before either child has bound it."""
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free now, below the kernel's ephemeral range, and not handed out
    before by this process. A port from ``bind(0)`` lies in that range, where the local end of every
    outgoing connection comes from: during the seconds a child process takes to bind it, one of the
    hundreds of connections a benchmark opens could take it ("Address already in use")."""
    lowest, ceiling = _port_slice(LOWEST_PORT, _ephemeral_floor())
    for _ in range(1000 if ceiling > lowest else 0):
        port = random.randrange(lowest, ceiling)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_slice(lowest: int, ceiling: int) -> tuple[int, int]:
    """This process's share (PORT_SHARE) of the ports from ``lowest`` up to ``ceiling``."""
    index, count = PORT_SHARE
    width = max(ceiling - lowest, 0) // count
    return lowest + index * width, lowest + (index + 1) * width


def _ephemeral_floor() -> int:
    """The lowest port of the kernel's ephemeral range (IANA's 49152 where it cannot be read)."""
    try:
        return int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def module_command(module: str, *args: str) -> list[str]:
    """Run a Python module of this repo with the current interpreter."""
    return [sys.executable, "-m", module, *args]


def kvgate_command(*args: str) -> list[str]:
    return module_command("gateway.process.cli", *args)


@dataclass
class Process:
    """A child in its own process group, serving HTTP on 127.0.0.1:port."""

    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command_head(self) -> list[str]:
        """The first words of its command line, to name it in errors."""
        args = self.proc.args
        return [str(arg) for arg in args[:4]] if isinstance(args, list) else [str(args)]

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout_s)


def launch(command: list[str], port: int, log_path: Path, env: Mapping[str, str] | None = None) -> Process:
    """Start ``command`` in its own session, its output to ``log_path``; ``env`` adds to the environment."""
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})},
            start_new_session=True,
        )
    return Process(proc, port, log_path)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def http_post_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=10) as response:
            return response.status == 200
    except OSError:
        return False


def http_body(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read() if response.status == 200 else None
    except OSError:
        return None


def wait_ready(process: Process, is_ready: Callable[[], bool], timeout_s: float = 60.0, poll_s: float = 0.2) -> None:
    """Poll ``is_ready`` every ``poll_s`` until true; stop the process and raise with its log if it dies or
    times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.proc.poll() is not None:
            raise RuntimeError(f"{process.command_head} exited with {process.proc.returncode}:\n{process.log_tail()}")
        if is_ready():
            return
        time.sleep(poll_s)
    process.stop()
    raise TimeoutError(f"{process.command_head} not ready after {timeout_s}s:\n{process.log_tail()}")
