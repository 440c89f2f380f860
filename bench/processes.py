"""Child processes of a benchmark (replicas, gateways, peer routers): start, wait until ready, stop."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def module_command(module: str, *args: str) -> list[str]:
    """Run a Python module of this repo with the current interpreter."""
    return [sys.executable, "-m", module, *args]


def kvgate_command(*args: str) -> list[str]:
    return module_command("gateway.cli", *args)


@dataclass
class Process:
    """A child in its own process group, serving HTTP on 127.0.0.1:port."""

    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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


def launch(command: list[str], port: int, log_path: Path) -> Process:
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
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


def wait_ready(process: Process, is_ready: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll ``is_ready`` until true; stop the process and raise with its log if it dies or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.proc.poll() is not None:
            raise RuntimeError(f"{process.proc.args[:4]} exited with {process.proc.returncode}:\n{process.log_tail()}")
        if is_ready():
            return
        time.sleep(0.2)
    process.stop()
    raise TimeoutError(f"{process.proc.args[:4]} not ready after {timeout_s}s:\n{process.log_tail()}")
