"""The parent of `kvgate gateway --workers N` and `kvgate epp --workers N`: start N workers on one
port, keep them alive, stop them together.

Each worker is a full gateway or picker (the same command with a worker identity in its
environment) that binds its ports with SO_REUSEPORT, so the kernel spreads connections over them. The parent
serves no requests: it counts tenant limits for every worker on a private unix socket (unless
`shared_state` puts them in Redis; gateway/process/workers/limit_server.py), restarts a worker that dies,
forwards SIGHUP (reload) to every worker, and on SIGTERM/SIGINT stops them all. Workers get SIGTERM if the parent dies
(Linux parent-death signal), so no worker outlives it.

Each worker runs in a session of its own. Where the kernel groups tasks by session for CPU
fairness (``sched_autogroup``, on by default on most desktops and shells), workers sharing the
parent's session would share one task's CPU share between them: on a busy host two workers then
served no more than one, at ~1.5x the CPU per request (bench/RESULTS.md, issue 12).
"""

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.process.workers.identity import WorkerIdentity, limits_socket
from gateway.process.workers.limit_server import LimitServer

log = logging.getLogger("kvgate.workers")

_PR_SET_PDEATHSIG = 1
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
"""Wait before restarting a worker that died, by how many times it died within STABLE_S."""
STABLE_S = 30.0
STOP_GRACE_S = 35.0
"""A worker drains in-flight requests for up to 30 s (gateway/process/server.py) before it exits."""


def die_with_parent() -> None:
    """preexec_fn for children: SIGTERM when the parent process dies (Linux)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class WorkerSlot:
    identity: WorkerIdentity
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    recent_deaths: int = 0


def worker_command(*args: str) -> list[str]:
    """The command line of a worker running ``kvgate ARGS``."""
    return [sys.executable, "-m", "gateway.process.cli", *args]


async def run_workers(command: list[str], count: int) -> int:
    """Run ``count`` workers of ``command`` until SIGTERM or SIGINT; 0 once they all stopped."""
    socket_dir = Path(tempfile.mkdtemp(prefix="kvgate-workers-"))
    slots = [WorkerSlot(WorkerIdentity(index, count, socket_dir)) for index in range(count)]
    limits = LimitServer(limits_socket(socket_dir))
    await limits.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    loop.add_signal_handler(signal.SIGHUP, _forward, slots, signal.SIGHUP)
    try:
        keepers = [asyncio.create_task(_keep_alive(slot, command, stopping)) for slot in slots]
        await stopping.wait()
        _forward(slots, signal.SIGTERM)
        await asyncio.gather(*keepers)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
        await limits.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
    return 0


async def _keep_alive(slot: WorkerSlot, command: list[str], stopping: asyncio.Event) -> None:
    """Start the slot's worker, and again each time it dies, until the parent stops."""
    env = {**os.environ, **slot.identity.env()}
    index = slot.identity.index
    while not stopping.is_set():
        slot.process = await asyncio.create_subprocess_exec(
            *command, env=env, preexec_fn=die_with_parent, start_new_session=True
        )
        slot.started_at = time.monotonic()
        log.info("worker %d started (pid %d)", index, slot.process.pid)
        exited = asyncio.create_task(slot.process.wait())
        stopped = asyncio.create_task(stopping.wait())
        await asyncio.wait({exited, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if stopping.is_set():
            stopped.cancel()
            await _stop(slot.process, exited)
            return
        stopped.cancel()
        slot.recent_deaths = slot.recent_deaths + 1 if time.monotonic() - slot.started_at < STABLE_S else 1
        backoff = RESTART_BACKOFF_S[min(slot.recent_deaths, len(RESTART_BACKOFF_S)) - 1]
        log.error(
            "worker %d (pid %d) exited with status %s; restarting in %.1fs",
            index,
            slot.process.pid,
            slot.process.returncode,
            backoff,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), backoff)


async def _stop(process: asyncio.subprocess.Process, exited: "asyncio.Task[int]") -> None:
    """The worker had SIGTERM: wait for its drain, then SIGKILL."""
    try:
        await asyncio.wait_for(asyncio.shield(exited), STOP_GRACE_S)
    except TimeoutError:
        process.kill()
        await exited


def _forward(slots: list[WorkerSlot], signum: signal.Signals) -> None:
    for slot in slots:
        if slot.process is not None and slot.process.returncode is None:
            slot.process.send_signal(signum)
