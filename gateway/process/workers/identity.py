"""Which worker this process is, and where its siblings listen privately.

The parent hands each worker its number and a private folder (mode 0700) in the environment;
worker ``i`` serves its own state on the unix socket ``<folder>/worker-<i>.sock``, and the parent
counts tenant limits for all of them on ``<folder>/limits.sock``.
"""

import os
from dataclasses import dataclass
from pathlib import Path

WORKER_ENV = "KVGATE_WORKER"
"""``INDEX/COUNT``, e.g. ``0/2``; set by the parent for each worker it starts."""
SOCKET_DIR_ENV = "KVGATE_WORKER_DIR"


@dataclass(frozen=True)
class WorkerIdentity:
    index: int
    count: int
    socket_dir: Path

    @classmethod
    def from_env(cls) -> "WorkerIdentity | None":
        """This process's identity, or None when it is not a worker of a parent gateway."""
        value, folder = os.environ.get(WORKER_ENV), os.environ.get(SOCKET_DIR_ENV)
        if not value or not folder:
            return None
        index, count = (int(part) for part in value.split("/"))
        return cls(index, count, Path(folder))

    def env(self) -> dict[str, str]:
        return {WORKER_ENV: f"{self.index}/{self.count}", SOCKET_DIR_ENV: str(self.socket_dir)}

    def socket_path(self, index: int | None = None) -> Path:
        return self.socket_dir / f"worker-{self.index if index is None else index}.sock"

    @property
    def limits_socket(self) -> Path:
        """Where the parent counts tenant limits for every worker (gateway/process/workers/limit_server.py)."""
        return limits_socket(self.socket_dir)

    @property
    def siblings(self) -> list[int]:
        return [index for index in range(self.count) if index != self.index]


def limits_socket(socket_dir: Path) -> Path:
    return socket_dir / "limits.sock"
