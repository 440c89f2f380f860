"""The event-loop lag monitor measures a blocked loop and names what blocked it."""

import asyncio
import logging
import re
import time

import pytest
from prometheus_client import generate_latest

from gateway.observability.loop_lag import LoopLagMonitor
from gateway.observability.metrics import GatewayMetrics


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)


async def test_a_blocked_loop_shows_as_lag_and_its_stack_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    metrics = GatewayMetrics()
    monitor = LoopLagMonitor(metrics.loop_lag, metrics.loop_lag_max, interval_s=0.02, stall_s=0.1)
    caplog.set_level(logging.WARNING, logger="kvgate.loop")
    monitor.start()
    try:
        await asyncio.sleep(0.05)
        hold_the_loop(0.5)
        while monitor.worst_s < 0.3:
            await asyncio.sleep(0.02)
    finally:
        await monitor.stop()
    exposition = generate_latest(metrics.registry).decode()
    assert 'kvgate_event_loop_lag_seconds_bucket{le="0.25"}' in exposition
    worst = re.search(r"^kvgate_event_loop_lag_max_seconds (\S+)$", exposition, re.M)
    assert worst is not None and float(worst.group(1)) >= 0.3
    stalls = [record.getMessage() for record in caplog.records if "so far" in record.getMessage()]
    assert stalls and "hold_the_loop" in stalls[0]
