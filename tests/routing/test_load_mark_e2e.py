"""A queued request counts once in the gateway's load view, however soon after it was sent the
replica's report comes: real gateway, one simulated engine, loopback.

The engine counts a request from the moment it arrives. Guessing by time (a request sent 20 ms
before a report is in it) counted a request twice when a report came sooner, until a report 20 ms
after the send (here every send; with the default 50 ms reports, often in a burst); the engine's
acknowledgement (``x-kvgate-load-mark``) tells the gateway exactly. The pool saturation gauge shows it: one replica, ``waiting / 5``."""

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from gateway.observability.saturation import QUEUE_DEPTH_THRESHOLD
from tests.gateway_cluster import gateway_for
from tests.observability.test_pool_saturation_e2e import saturation, send_stream, wait_for
from tests.procs import ManagedProcess, free_port, start_engine

MODEL = "smollm2-135m"
QUEUED = 4
REPORT_INTERVAL_S = 0.005
"""Every send meets a report within a few ms of it, one that already counts the request."""
WATCH_S = 0.3


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[ManagedProcess]:
    load_events = f"tcp://127.0.0.1:{free_port()}"
    engine = start_engine(
        tmp_path,
        "--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.05",
        "--block-size", "16", "--num-blocks", "1024", "--max-num-seqs", "1",
        "--load-events", load_events, "--load-events-interval-s", str(REPORT_INTERVAL_S),
    )  # fmt: skip
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "model": MODEL,
        "block_size": 16,
        "backends": [{"name": "e0", "url": engine.url, "load_events": load_events}],
        "health": {"interval_s": 0.5},
    }
    try:
        with gateway_for(tmp_path, config) as gateway:
            yield gateway
    finally:
        engine.stop()


def test_each_queued_request_counts_once_from_the_moment_it_is_sent(gateway: ManagedProcess) -> None:
    wait_for(lambda: saturation(gateway) == 0.0, "the replica healthy, idle and reporting")
    with ExitStack() as stack:
        send_stream(gateway, stack, 0)
        time.sleep(0.5)  # running: the batch of one is full, the next ones queue
        assert saturation(gateway) < 1 / QUEUE_DEPTH_THRESHOLD, "its KV blocks only: nothing waits"
        for queued in range(1, QUEUED + 1):
            send_stream(gateway, stack, queued)
            readings = []
            deadline = time.monotonic() + WATCH_S
            while time.monotonic() < deadline:
                readings.append(saturation(gateway))
            assert max(readings) == queued / QUEUE_DEPTH_THRESHOLD, readings
            assert readings[-1] == queued / QUEUE_DEPTH_THRESHOLD, readings
    wait_for(lambda: saturation(gateway) == 0.0, "the closed streams to leave the replica")
