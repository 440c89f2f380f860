"""The model is built on a thread that is gone, OpenMP team included, once the build returns."""

import os
import sys
import threading
import time

import pytest
import torch

from engine.model.omp_team import on_short_lived_thread


def test_returns_what_the_build_made_from_another_thread_that_has_exited() -> None:
    built_on: list[threading.Thread] = []

    def build() -> str:
        built_on.append(threading.current_thread())
        return "model"

    assert on_short_lived_thread(build) == "model"
    assert built_on[0] is not threading.main_thread()
    assert not built_on[0].is_alive()


def test_a_failed_build_raises_its_own_error() -> None:
    def build() -> None:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        on_short_lived_thread(build)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="lists threads in /proc/self/task")
def test_the_builds_parallel_workers_exit_with_it() -> None:
    """Threads are told apart by id, not counted: threads other tests left behind may come and go."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        matrix = torch.randn(512, 512)
        before = task_ids()
        inside = on_short_lived_thread(lambda: (matrix @ matrix, task_ids())[1])
    finally:
        torch.set_num_threads(threads)
    started = inside - before
    assert len(started) >= 2, "the build thread and at least one OpenMP worker ran"
    assert all_exit(started), "the build's OpenMP workers outlived it"


def task_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def all_exit(threads: set[str], timeout_s: float = 30.0) -> bool:
    """Whether every one of ``threads`` is gone within ``timeout_s`` (workers exit just after their master)."""
    deadline = time.monotonic() + timeout_s
    while threads & task_ids():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
