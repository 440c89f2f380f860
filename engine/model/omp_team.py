"""Build the model on a short-lived thread, so the engine thread's OpenMP team is the only one alive.

Each thread that runs a parallel PyTorch op gets its own OpenMP team, whose worker threads live
as long as that thread. Building a CPU model runs parallel ops (oneDNN reorders its weights); done
on the main thread, that team stays, and the engine thread's is a second one. libgomp then
manages more threads than there are CPUs and, to be fair to them, lets a waiting worker spin only
~1,000 times (instead of ~300,000) before it sleeps: every one of a step's ~2,000 parallel ops
then wakes a sleeping worker. Measured on the 2-core dev VM (``bench/VLLM.md``), 2 threads, a step
run on a worker thread: cached prompt (128 new tokens over 1,408) 125 -> 87-92 ms, cold
1,536-token prefill 930-975 -> 763-786 ms, CPU time over wall time 1.03-1.45 -> 1.82.

The price is libgomp's ordinary spinning: on cores other processes keep busy, a worker spins
while its master waits to be scheduled, as every OpenMP program's does; ``--threads 1`` is the
setting for a replica that shares its cores.
"""

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_short_lived_thread(build: Callable[[], T]) -> T:
    """``build()`` run on a thread that exits before this returns (its OpenMP team with it)."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(build())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="model-build")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
