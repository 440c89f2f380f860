"""A gateway in front of simulated engine replicas (real processes on loopback) for observability tests."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.procs import ManagedProcess, free_port, start_engine, start_gateway

MODEL = "smollm2-135m"


@dataclass
class Deployment:
    gateway: ManagedProcess
    engines: list[ManagedProcess]
    request_log: Path

    @property
    def url(self) -> str:
        return self.gateway.url


@contextmanager
def deployment(tmp_path: Path, replicas: int = 2, extra_config: dict | None = None) -> Iterator[Deployment]:
    """Engines in `--sim` mode publishing KV events, and a gateway routing on them (precise mode).
    The engines take no simulated time (``--sim-preset instant``): these tests read what the gateway
    records and exports, not step timing.

    ``extra_config`` adds top-level sections to the gateway's config (tenants, admin key).
    """
    engines: list[ManagedProcess] = []
    gateway: ManagedProcess | None = None
    try:
        backends = []
        for index in range(replicas):
            events = f"tcp://127.0.0.1:{free_port()}"
            engine = start_engine(
                tmp_path,
                "--sim",
                "--sim-preset",
                "instant",
                "--block-size",
                "16",
                "--num-blocks",
                "1024",
                "--kv-events",
                events,
                name=f"engine-{index}",
            )
            engines.append(engine)
            backends.append({"name": f"engine-{index}", "url": engine.url, "kv_events": events})
        port = free_port()
        request_log = tmp_path / "requests.jsonl"
        config = {
            "listen": {"host": "127.0.0.1", "port": port},
            "model": MODEL,
            "block_size": 16,
            "backends": backends,
            "health": {"interval_s": 0.5},
            "observability": {"request_log_path": str(request_log), "stats_bucket_s": 1},
            **(extra_config or {}),
        }
        config_path = tmp_path / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config))
        gateway = start_gateway(tmp_path, config_path, port)
        yield Deployment(gateway, engines, request_log)
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            engine.stop()
