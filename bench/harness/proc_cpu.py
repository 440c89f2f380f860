"""CPU time of process trees, from /proc: what a gateway, a backend or a load generator spent.

Read from each thread's ``/proc/PID/task/TID/schedstat`` (nanoseconds on the CPU), so it is
exact where ``/proc/PID/stat``'s clock ticks are 10 ms samples. A thread that exits between two
readings takes its time with it; the processes measured here keep their threads.
"""

from pathlib import Path

PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children of each thread, recursively)."""
    found = [pid]
    for task in _tasks(pid):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            found += descendants(int(child))
    return found


def cpu_ns(pids: list[int]) -> int:
    """Nanoseconds on the CPU of the live threads of ``pids``."""
    total = 0
    for pid in pids:
        for task in _tasks(pid):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with (empty if unreadable)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _tasks(pid: int) -> list[Path]:
    try:
        return list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return []
