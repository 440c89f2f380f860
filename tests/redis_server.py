"""A real redis-server for tests: started on a free port, stopped (or killed, or restarted) by the test."""

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.procs import free_port

REDIS_SERVER = shutil.which("redis-server")
SKIP_REASON = "redis-server is not installed (`make test` installs it where apt-get can)"


def require_redis() -> str:
    """The redis-server binary, or skip the calling test with the reason."""
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    return REDIS_SERVER


class RedisServer:
    """One redis-server process without persistence; ``restart`` brings it back empty on the same port."""

    def __init__(
        self, log_dir: Path, host: str = "127.0.0.1", port: int | None = None, prefix: list[str] | None = None
    ):
        self.host = host
        self.port = port or free_port()
        self.log_path = log_dir / f"redis-{self.port}.log"
        self.prefix = prefix or []
        """A command prefix, e.g. ["ip", "netns", "exec", NS] to run it in a network namespace."""
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> "RedisServer":
        binary = require_redis()
        command = [
            *self.prefix,
            binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ]
        with open(self.log_path, "ab") as log:
            logged_before = log.tell()
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(logged_before)
        return self

    def stop(self) -> None:
        """SIGKILL: the server is gone at once, as in a crash (and nothing is saved)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _wait_ready(self, logged_before: int, timeout_s: float = 15.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            if b"Ready to accept connections" in self.log_path.read_bytes()[logged_before:]:
                return
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"redis-server not ready after {timeout_s}s:\n{self.log_path.read_text()}")


@contextmanager
def redis_server(log_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir).start()
    try:
        yield server
    finally:
        server.stop()
