"""``kvgate_pool_saturation`` on a real gateway in front of two simulated engines: 0 when idle, up while
streams held open fill the replicas' batches and queues, back to 0 when they close."""

import http.client
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.saturation import QUEUE_DEPTH_THRESHOLD
from tests.procs import ManagedProcess, free_port, start_engine, start_gateway

MODEL = "smollm2-135m"
REPLICAS = 2
MAX_NUM_SEQS = 2
QUEUED_PER_REPLICA = 2


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("saturation")
    with ExitStack() as stack:
        backends = []
        for index in range(REPLICAS):
            load_events = f"tcp://127.0.0.1:{free_port()}"
            engine = start_engine(
                tmp_path,
                "--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.05",
                "--block-size", "16", "--num-blocks", "1024", "--max-num-seqs", str(MAX_NUM_SEQS),
                "--load-events", load_events,
                name=f"engine-{index}",
            )  # fmt: skip
            stack.callback(engine.stop)
            backends.append({"name": f"engine-{index}", "url": engine.url, "load_events": load_events})
        port = free_port()
        config = {
            "listen": {"host": "127.0.0.1", "port": port},
            "model": MODEL,
            "block_size": 16,
            "backends": backends,
            "health": {"interval_s": 0.5},
        }
        config_path = tmp_path / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config))
        process = start_gateway(tmp_path, config_path, port)
        stack.callback(process.stop)
        yield process


def saturation(gateway: ManagedProcess) -> float:
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    (family,) = (family for family in text_string_to_metric_families(text) if family.name == "kvgate_pool_saturation")
    assert family.type == "gauge"
    (sample,) = family.samples
    assert sample.labels == {"model": MODEL}
    return sample.value


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def send_stream(gateway: ManagedProcess, stack: ExitStack, seed: int) -> None:
    """Send a long streamed completion through the gateway and leave it running until ``stack`` closes
    the connection (the answer is not awaited: a queued request sends nothing until it runs)."""
    port = int(gateway.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    stack.callback(connection.close)
    body = {"model": MODEL, "prompt": [2000 + seed] * 100, "max_tokens": 400, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})


def test_saturation_rises_with_queued_requests_and_falls_when_they_leave(gateway: ManagedProcess) -> None:
    wait_for(lambda: saturation(gateway) == 0.0, "both replicas healthy, idle and reporting")
    streams = REPLICAS * (MAX_NUM_SEQS + QUEUED_PER_REPLICA)
    with ExitStack() as stack:
        for seed in range(streams):
            send_stream(gateway, stack, seed)
        # The router spreads the streams; whatever the split, the mean queue is QUEUED_PER_REPLICA.
        expected = QUEUED_PER_REPLICA / QUEUE_DEPTH_THRESHOLD
        # Until a replica's report acknowledges a request (tests/routing/test_load_mark_e2e.py), the
        # gateway counts it as waiting there, running or not: the reading settles from above.
        wait_for(lambda: saturation(gateway) == expected, f"saturation of {expected}")
    wait_for(lambda: saturation(gateway) == 0.0, "the closed streams to leave the replicas")


def test_unreachable_replicas_count_as_saturated(tmp_path: Path) -> None:
    """A model whose replicas never answer reads as saturated: nothing can take its load."""
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": MODEL,
        "block_size": 16,
        "backends": [{"name": "gone", "url": f"http://127.0.0.1:{free_port()}"}],
        "health": {"interval_s": 0.5},
    }
    config_path = tmp_path / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    process = start_gateway(tmp_path, config_path, port)
    try:
        assert saturation(process) == 1.0
    finally:
        process.stop()
