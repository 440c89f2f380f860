"""Work moved off the event loop runs in threads scheduled below the loop thread."""

import asyncio
import os
import threading

from gateway.process.background_threads import NICE_INCREMENT, install_background_executor


def own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_to_thread_work_runs_below_the_loop_threads_priority() -> None:
    async def main() -> tuple[int, int]:
        install_background_executor(asyncio.get_running_loop())
        return own_nice(), await asyncio.to_thread(own_nice)

    loop_nice, thread_nice = asyncio.run(main())
    assert thread_nice == min(loop_nice + NICE_INCREMENT, 19)
    assert thread_nice > loop_nice or loop_nice == 19, "a process already at the lowest priority has none lower"


def test_the_loop_thread_keeps_its_priority() -> None:
    before = own_nice()

    async def main() -> None:
        install_background_executor(asyncio.get_running_loop())
        await asyncio.to_thread(own_nice)

    asyncio.run(main())
    assert own_nice() == before
