"""A queued request counts once in every gateway's load view, however soon after it was sent the
replica's report comes: two real gateways in front of one simulated engine, loopback.

The engine counts a request from the moment it arrives. Guessing by time (a request sent 20 ms
before a report is in it) counted a request twice when a report came sooner, until a report 20 ms
after the send (here every send; with the default 50 ms reports, often in a burst); the engine's
acknowledgement (``x-kvgate-load-mark``) tells each gateway exactly which of its own requests the
report holds, and nothing about the other's. The pool saturation gauge shows it: one replica,
``waiting / 5``."""

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from gateway.observability.saturation import QUEUE_DEPTH_THRESHOLD
from tests.gateway_cluster import gateways_for
from tests.observability.test_pool_saturation_e2e import saturation, send_stream, wait_for
from tests.procs import ManagedProcess, free_port, start_engine

MODEL = "smollm2-135m"
QUEUED = 4
REPORT_INTERVAL_S = 0.005
"""Every send meets a report within a few ms of it, one that already counts the request."""
WATCH_S = 0.3


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[list[ManagedProcess]]:
    load_events = f"tcp://127.0.0.1:{free_port()}"
    engine = start_engine(
        tmp_path,
        "--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.05",
        "--block-size", "16", "--num-blocks", "1024", "--max-num-seqs", "1",
        "--load-events", load_events, "--load-events-interval-s", str(REPORT_INTERVAL_S),
    )  # fmt: skip
    configs = {
        name: {
            "listen": {"host": "127.0.0.1", "port": free_port()},
            "model": MODEL,
            "block_size": 16,
            "backends": [{"name": "e0", "url": engine.url, "load_events": load_events}],
            "health": {"interval_s": 0.5},
        }
        for name in ("a", "b")
    }
    try:
        with gateways_for(tmp_path, configs) as started:
            yield list(started.values())
    finally:
        engine.stop()


def all_read(gateways: list[ManagedProcess], value: float) -> bool:
    return all(saturation(gateway) == value for gateway in gateways)


def test_each_queued_request_counts_once_in_every_gateway_from_the_moment_it_is_sent(
    gateways: list[ManagedProcess],
) -> None:
    wait_for(lambda: all_read(gateways, 0.0), "the replica healthy, idle and reporting to both")
    with ExitStack() as stack:
        send_stream(gateways[0], stack, 0)
        time.sleep(0.5)  # running: the batch of one is full, the next ones queue
        assert saturation(gateways[1]) < 1 / QUEUE_DEPTH_THRESHOLD, "its KV blocks only: nothing waits"
        for queued in range(1, QUEUED + 1):
            send_stream(gateways[queued % 2], stack, queued)
            readings: dict[int, list[float]] = {0: [], 1: []}
            deadline = time.monotonic() + WATCH_S
            while time.monotonic() < deadline:
                for index, gateway in enumerate(gateways):
                    readings[index].append(saturation(gateway))
            for seen in readings.values():
                assert max(seen) == queued / QUEUE_DEPTH_THRESHOLD, readings
                assert seen[-1] == queued / QUEUE_DEPTH_THRESHOLD, readings
    wait_for(lambda: all_read(gateways, 0.0), "the closed streams to leave the replica")
