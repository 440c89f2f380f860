"""Event-loop lag: how late a periodic timer fires is how long the loop was busy with something else.

Everything the gateway does runs on one event loop, so a callback that holds it for 100 ms
delays every request by up to 100 ms. A timer every ``interval_s`` records its lateness in
``kvgate_event_loop_lag_seconds`` (and the worst in ``kvgate_event_loop_lag_max_seconds``).
A watchdog thread notices a stall while it lasts (the timer can only speak after it) and logs
the stack the loop thread is running right then: that names the slow callback, at the cost of a
thread that wakes up a few times a second, instead of asyncio's debug mode, which slows every
callback. Each stall line says how much of it this thread spent on the CPU (little means the
process was not scheduled: an overloaded machine, not slow code), and garbage-collection passes
that take longer than a tenth of ``stall_s`` are logged with their generation.
"""

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback

from prometheus_client import Gauge, Histogram

log = logging.getLogger("kvgate.loop")

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LoopLagMonitor:
    def __init__(self, lag: Histogram, worst: Gauge, interval_s: float = 0.1, stall_s: float = 0.25) -> None:
        self.lag = lag
        self.worst = worst
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.worst_s = 0.0
        self._last_tick = time.monotonic()
        self._task: asyncio.Task | None = None
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._gc_started = 0.0

    def start(self) -> None:
        """Start the timer on the running loop and the watchdog on a daemon thread."""
        self._last_tick = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._tick_forever())
        loop_thread = threading.get_ident()
        self._watchdog = threading.Thread(target=self._watch, args=(loop_thread,), name="kvgate-loop-watchdog")
        self._watchdog.daemon = True
        self._watchdog.start()
        gc.callbacks.append(self._gc_phase)

    async def stop(self) -> None:
        self._stop.set()
        if self._gc_phase in gc.callbacks:
            gc.callbacks.remove(self._gc_phase)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            cpu_before = time.thread_time()
            await asyncio.sleep(self.interval_s)
            self._tick(max(0.0, loop.time() - due), time.thread_time() - cpu_before)

    def _tick(self, lag_s: float, cpu_s: float) -> None:
        self._last_tick = time.monotonic()
        self.lag.observe(lag_s)
        if lag_s > self.worst_s:
            self.worst_s = lag_s
            self.worst.set(lag_s)
        if lag_s >= self.stall_s:
            log.warning(
                "event loop was blocked for %.3fs (this thread used %.3fs of CPU in the last %.3fs)",
                lag_s,
                cpu_s,
                lag_s + self.interval_s,
            )

    def _gc_phase(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took_s = time.perf_counter() - self._gc_started
        if took_s >= self.stall_s / 10:
            log.warning("garbage collection of generation %d took %.3fs", info["generation"], took_s)

    def _watch(self, loop_thread: int) -> None:
        """Log the loop thread's stack once per stall, while the stall lasts."""
        reported_tick = None
        while not self._stop.wait(self.stall_s / 2):
            last_tick = self._last_tick
            blocked_s = time.monotonic() - last_tick - self.interval_s
            if blocked_s < self.stall_s or reported_tick == last_tick:
                continue
            reported_tick = last_tick
            frame = sys._current_frames().get(loop_thread)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)\n"
            log.warning("event loop blocked for %.3fs so far; it is running:\n%s", blocked_s, stack.rstrip())
