"""A replica that restarts comes back with an empty KV cache: the gateway (predicted mode) forgets
the prefixes it had put there, from the later start time the engine reports, before the next
request would be sent there for a hit it cannot have."""

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.bodies import chat
from tests.gateway_cluster import INSTANT_SIM, gateway_config, gateway_for, running, start_engines
from tests.procs import ManagedProcess, free_port, http, kvgate_cmd, start

pytestmark = pytest.mark.slow

SYSTEM = " ".join(f"Rule {index}: cite clause {index * 3} before answering." for index in range(40))


def gateway_metric(gateway: ManagedProcess, name: str, **labels: str) -> float:
    reply = http("GET", f"{gateway.url}/metrics")
    assert reply.status == 200
    return sum(
        sample.value
        for family in text_string_to_metric_families(reply.body.decode())
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items())
    )


def ask(gateway: ManagedProcess) -> dict[str, str]:
    reply = http("POST", f"{gateway.url}/v1/chat/completions", chat("What comes first?", 2, system=SYSTEM))
    assert reply.status == 200, reply.body
    return reply.headers


def test_a_restarted_engine_holds_nothing_in_the_index(tmp_path: Path) -> None:
    with running(start_engines(tmp_path, 1, *INSTANT_SIM)) as engines:
        config = gateway_config(free_port(), engines, routing={"policy": "cache_aware"})
        with gateway_for(tmp_path, config) as gateway:
            ask(gateway)
            assert int(ask(gateway)["x-kvgate-predicted-cached-tokens"]) > 0
            held = gateway_metric(gateway, "kvgate_prefix_index_replica_blocks", backend="e0", kind="confirmed")
            assert held > 0

            port = engines[0].port
            engines[0].kill()
            engines[0] = start(kvgate_cmd("engine", "--port", str(port), *INSTANT_SIM), port, tmp_path / "again.log")
            deadline = time.monotonic() + 30
            while gateway_metric(gateway, "kvgate_backend_restarts_total", backend="e0") < 1:
                assert time.monotonic() < deadline, "the gateway never saw the restart"
                time.sleep(0.05)

            assert gateway_metric(gateway, "kvgate_prefix_index_replica_blocks", backend="e0", kind="confirmed") == 0
            again = ask(gateway)
            assert again["x-kvgate-predicted-cached-tokens"] == "0", "nothing is predicted on an empty cache"
