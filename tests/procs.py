"""Start and stop real kvgate processes on loopback for tests."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ManagedProcess:
    """A child process serving HTTP on 127.0.0.1:port; ``stop`` ends it and its group."""

    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the process alone, as a crash would."""
        self.proc.kill()
        self.proc.wait(15)


def kvgate_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


def start(
    cmd: list[str],
    port: int,
    log_path: Path,
    ready_path: str = "/health",
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
) -> ManagedProcess:
    """Start ``cmd`` in its own process group and wait until GET ready_path answers 200."""
    log_file = open(log_path, "wb")
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        start_new_session=True,
    )
    log_file.close()
    managed = ManagedProcess(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited with {proc.returncode}:\n{managed.log()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{managed.url}{ready_path}", timeout=2) as response:
                if response.status == 200:
                    return managed
        except OSError:
            pass
        time.sleep(0.2)
    managed.stop()
    raise TimeoutError(f"{cmd} not ready after {timeout}s:\n{managed.log()[-4000:]}")


def start_engine(tmp_path: Path, *flags: str, name: str = "engine") -> ManagedProcess:
    """A bundled engine replica (`kvgate engine`) with the given flags on a free port."""
    port = free_port()
    return start(kvgate_cmd("engine", "--port", str(port), *flags), port, tmp_path / f"{name}-{port}.log")


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


def http(method: str, url: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None, timeout: float = 60) -> HttpReply:
    """One plain HTTP call that returns error statuses instead of raising (for bad-input tests)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return HttpReply(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as error:
        return HttpReply(error.code, dict(error.headers), error.read())
