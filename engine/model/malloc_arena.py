"""One glibc malloc arena for the whole process, so a CPU step's tensors reuse memory instead of faulting it in.

glibc gives every thread that allocates its own arena. The engine's forward pass runs on the engine
thread, not the main thread, and a secondary arena hands the pages of a freed multi-megabyte tensor
back to the kernel (``madvise``) when its heap shrinks: the next step's tensors fault them in again.
Measured on the 2-core dev VM (``bench/VLLM.md``): 50-60k minor page faults per cold 1,536-token
bfloat16 prefill in the server, about 14 with one arena, and the cold TTFT fell from 1.30-1.59 s to
1.04-1.19 s. The main thread's arena does not shrink that way.

``MALLOC_ARENA_MAX`` (or ``glibc.malloc.arena_max`` in ``GLIBC_TUNABLES``) set by the user wins.

One arena is not enough in float32: its step tensors are twice as large, and glibc serves a block
above its (dynamic) mmap threshold with its own ``mmap``, unmapped again on ``free``, so every step
faults it in anew (140-150k minor faults per cold 1,536-token float32 prefill with one arena).
``keep_large_blocks_in_heap`` raises that threshold to glibc's most (32 MiB) and the heap's trim
threshold to 1 GiB, so the blocks come from the heap and stay there: 13 faults. The price is that
the process keeps up to its peak step's working set mapped between steps.
"""

import ctypes
import logging
import os
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter number for the arena limit (``malloc.h``)."""
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter numbers for the heap trim and mmap thresholds (``malloc.h``)."""
MMAP_THRESHOLD_BYTES = 32 << 20
"""The largest mmap threshold glibc accepts on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``)."""
TRIM_THRESHOLD_BYTES = 1 << 30


def use_one_malloc_arena() -> bool:
    """Limit glibc to one arena; threads that have not allocated yet share the main thread's.

    Call before the engine thread and the OpenMP threads start. Returns whether the limit was set
    (False off Linux, without glibc's ``mallopt``, or when the user chose an arena limit).
    """
    if _user_chose("MALLOC_ARENA_MAX", "arena_max"):
        return False
    mallopt = _mallopt()
    if mallopt is None or not mallopt(M_ARENA_MAX, 1):
        return False
    log.info("malloc: one arena for every thread (freed tensor memory is reused, not faulted in again)")
    return True


def keep_large_blocks_in_heap() -> bool:
    """Serve blocks up to 32 MiB from the heap and keep up to 1 GiB of freed heap mapped.

    Returns whether both were set (False off Linux, without glibc's ``mallopt``, or when the user
    chose either threshold through ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` or
    ``GLIBC_TUNABLES``).
    """
    if _user_chose("MALLOC_MMAP_THRESHOLD_", "mmap_threshold") or _user_chose(
        "MALLOC_TRIM_THRESHOLD_", "trim_threshold"
    ):
        return False
    mallopt = _mallopt()
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        return False
    if not mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES):
        return False
    log.info("malloc: tensors up to 32 MiB come from the heap, which keeps its freed pages")
    return True


def _mallopt() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return getattr(libc, "mallopt", None)


def _user_chose(variable: str, tunable: str) -> bool:
    return variable in os.environ or tunable in os.environ.get("GLIBC_TUNABLES", "")
