"""A gateway process that discovers its replicas (DNS or Kubernetes), over simulated engines that
share one set of ports on several loopback addresses, as a StatefulSet's pods do; and what the
discovery tests read back from it."""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.processes import http_ok, launch, wait_ready
from tests.procs import ManagedProcess, free_port, http, kvgate_cmd, start_gateway

MODEL = "smollm2-135m"


def fleet_ports() -> dict[str, int]:
    """The ports every replica serves on (its address tells them apart)."""
    return {name: free_port() for name in ("http", "kv_events", "kv_events_replay", "load_events")}


def rule_ports(ports: dict[str, int]) -> dict[str, int]:
    """A discovery rule's port settings for ``ports``."""
    return {f"{name}_port": ports[name] for name in ("kv_events", "kv_events_replay", "load_events")}


@contextmanager
def engines_on(addresses: tuple[str, ...], ports: dict[str, int], folder: Path) -> Iterator[list[ManagedProcess]]:
    """Simulated engines publishing KV events and load, one per address; stopped on exit. Instant:
    discovery, not step timing, is under test (the default preset takes 0.9 s a completion)."""
    started: list[ManagedProcess] = []
    try:
        for address in addresses:
            command = kvgate_cmd(
                "engine", "--sim", "--sim-preset", "instant", "--host", address, "--port", str(ports["http"]),
                "--kv-events", f"tcp://{address}:{ports['kv_events']}",
                "--kv-events-replay", f"tcp://{address}:{ports['kv_events_replay']}",
                "--load-events", f"tcp://{address}:{ports['load_events']}",
                "--block-size", "16", "--num-blocks", "512",
            )  # fmt: skip
            launched = launch(command, ports["http"], folder / f"engine-{address}.log")
            engine = ManagedProcess(launched.proc, ports["http"], launched.log_path)
            started.append(engine)
            wait_ready(engine, partial(http_ok, f"http://{address}:{ports['http']}/health"), 180)
        yield started
    finally:
        for engine in started:
            engine.stop()


def start_discovering_gateway(tmp_path: Path, discovery: dict) -> ManagedProcess:
    """``kvgate gateway`` with no static backends, only the ``discovery`` section."""
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": MODEL,
        "block_size": 16,
        "discovery": discovery,
        "health": {"interval_s": 0.3},
    }
    config_path = tmp_path / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    return start_gateway(tmp_path, config_path, port)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def healthy_backends(gateway: ManagedProcess) -> set[str]:
    reply = http("GET", f"{gateway.url}/health")
    assert reply.status == 200
    body = reply.json()
    assert isinstance(body, dict)
    return set(body["healthy_backends"])


def indexed_backends(gateway: ManagedProcess) -> set[str]:
    """Backends the prefix index holds confirmed blocks for (from their KV events)."""
    text = http("GET", f"{gateway.url}/metrics").body.decode()
    return {
        sample.labels["backend"]
        for family in text_string_to_metric_families(text)
        if family.name == "kvgate_prefix_index_replica_blocks"
        for sample in family.samples
        if sample.labels["kind"] == "confirmed" and sample.value > 0
    }


def complete(gateway: ManagedProcess, seed: int) -> str:
    """One completion with a prompt of its own; the backend that served it."""
    prompt = f"Request {seed}: " + "tell me about the tides of the northern sea. " * 8
    reply = http("POST", f"{gateway.url}/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 4})
    assert reply.status == 200, reply.body
    return reply.headers["x-kvgate-backend"]
