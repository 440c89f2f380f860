"""The real `kvgate epp` process in front of real simulated engines, for the end-to-end tests."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_cluster import INSTANT_SIM, gateway_config, running, start_engines, write_config
from tests.procs import ManagedProcess, free_port, http, kvgate_cmd, start


class Picker:
    def __init__(
        self, process: ManagedProcess, grpc_port: int, health_port: int, replicas: list[ManagedProcess]
    ) -> None:
        self.process = process
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        self.health_target = f"127.0.0.1:{health_port}"
        self.replicas = replicas
        self.engines = [replica.url.removeprefix("http://") for replica in replicas]
        """The engines' ``host:port``, e0 first."""

    def admin(self) -> dict[str, Any]:
        reply = http("GET", f"{self.process.url}/admin/backends")
        assert reply.status == 200, reply.body
        return reply.json()  # type: ignore[return-value]

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the picker's ``name`` samples whose labels include ``labels``."""
        text = http("GET", f"{self.process.url}/metrics").body.decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )


@contextmanager
def picker_for(tmp_path: Path, engine_count: int, flags: tuple[str, ...] = (), **sections: Any) -> Iterator[Picker]:
    """``kvgate epp FLAGS`` in front of ``engine_count`` fresh simulated engines (``gateway_config``
    with ``sections``), once it sees them all healthy; everything stops on exit."""
    with running(start_engines(tmp_path, engine_count, *INSTANT_SIM)) as engines:
        config = gateway_config(free_port(), engines, **sections)
        path = write_config(tmp_path / "epp.yaml", config)
        grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
        command = kvgate_cmd(
            "epp", "-c", str(path), "--host", "127.0.0.1", "--grpc-port", str(grpc_port),
            "--health-port", str(health_port), "--metrics-port", str(metrics_port), *flags,
        )  # fmt: skip
        process = start(command, metrics_port, tmp_path / "epp.log", ready_path="/dashboard")
        try:
            picker = Picker(process, grpc_port, health_port, engines)
            wait_until(lambda: all(backend["healthy"] for backend in picker.admin()["backends"]))
            yield picker
        finally:
            process.stop()


def wait_until(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
