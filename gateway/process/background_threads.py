"""Threads for the work the gateway moves off its event loop, scheduled below the loop.

Big bodies, long texts and secret redaction run in threads so that no request holds the loop
(``asyncio.to_thread`` uses the loop's default executor). On a host whose cores are busy, those
threads still take the CPU from the loop thread: a client sending megabytes of text for the
volatile-span regex kept a core busy, and every other request waited on the loop. Linux gives
each thread its own nice value, so these threads run ``NICE_INCREMENT`` below the loop: they use
what the loop leaves, and the loop runs whenever it has work.
"""

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("kvgate.threads")

NICE_INCREMENT = 10
MAX_WORKERS = 4


def lower_thread_priority() -> None:
    """Run the calling thread ``NICE_INCREMENT`` below its process (Linux: nice is per thread)."""
    try:
        thread_id = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(current + NICE_INCREMENT, 19))
    except (AttributeError, OSError) as exc:
        log.debug("background thread keeps its priority: %s", exc)


def install_background_executor(loop: asyncio.AbstractEventLoop) -> ThreadPoolExecutor:
    """Make the loop's default executor (``asyncio.to_thread``) one of low-priority threads."""
    executor = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="kvgate-offloop", initializer=lower_thread_priority)
    loop.set_default_executor(executor)
    return executor
