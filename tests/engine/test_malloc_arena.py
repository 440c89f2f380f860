"""One glibc malloc arena: a thread that allocates after the call shares the main thread's arena."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.model.malloc_arena import keep_large_blocks_in_heap, use_one_malloc_arena

REPO = Path(__file__).resolve().parents[2]

COUNT_ARENAS = """
import ctypes, sys, threading
from engine.model.malloc_arena import keep_large_blocks_in_heap, use_one_malloc_arena
if sys.argv[1] == "one":
    assert use_one_malloc_arena()
kept = []
worker = threading.Thread(target=lambda: kept.append(bytearray(50_000)))
worker.start()
worker.join()
ctypes.CDLL(None).malloc_stats()
"""


def arenas_after_a_thread_allocates(mode: str, **env: str) -> int:
    """The arenas glibc's ``malloc_stats`` lists after a worker thread allocated, in a fresh interpreter."""
    environment = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, mode],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "malloc_stats"), reason="needs glibc"
)
def test_worker_threads_share_the_main_arena() -> None:
    assert arenas_after_a_thread_allocates("default") == 2
    assert arenas_after_a_thread_allocates("one") == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")
def test_a_limit_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not use_one_malloc_arena()


COUNT_MMAPS = """
import ctypes, sys
from engine.model.malloc_arena import keep_large_blocks_in_heap
if sys.argv[1] == "heap":
    assert keep_large_blocks_in_heap()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(20 << 20))
libc.malloc_stats()
"""


def mmapped_blocks_after_a_20_mib_malloc(mode: str) -> int:
    """The ``max mmap regions`` glibc's ``malloc_stats`` reports after one 20 MiB block, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", COUNT_MMAPS, mode], cwd=REPO, capture_output=True, text=True, check=True
    )
    line = next(line for line in done.stderr.splitlines() if line.startswith("max mmap regions"))
    return int(line.rsplit("=", 1)[1])


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "malloc_stats"), reason="needs glibc"
)
def test_large_blocks_come_from_the_heap() -> None:
    assert mmapped_blocks_after_a_20_mib_malloc("heap") < mmapped_blocks_after_a_20_mib_malloc("default")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")
def test_a_threshold_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert not keep_large_blocks_in_heap()
