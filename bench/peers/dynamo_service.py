"""NVIDIA Dynamo's runtime-free KV router (``python -m dynamo.select_service``) as a peer process.

It runs from its own venv (``ai-dynamo-runtime``, see bench/harness/contenders.py for where), needs no
etcd or NATS, and learns each replica's cache from the replica's ZMQ KV events in vLLM's format:
``register_worker`` gives it the replica's HTTP endpoint, event socket and replay socket. Its cost
knobs come from a ``DynamoConfig`` (bench/peers/dynamo_config.py), Dynamo's defaults unless set.
"""

import urllib.request
from pathlib import Path

import orjson

from bench.harness.processes import Process, free_port, http_ok, launch, wait_ready
from bench.peers.dynamo_config import DYNAMO_DEFAULTS, DynamoConfig

SELECT_MODULE = "dynamo.select_service"


def start_select_service(
    python: Path, log_path: Path, config: DynamoConfig = DYNAMO_DEFAULTS, timeout_s: float = 60.0
) -> Process:
    """One select_service with ``config``'s cost knobs on a free port, ready when its ``/health`` answers."""
    port = free_port()
    process = launch([str(python), "-m", SELECT_MODULE, "--port", str(port)], port, log_path, config.env())
    wait_ready(process, lambda: http_ok(f"{process.url}/health"), timeout_s)
    return process


def worker_registration(
    worker_id: int,
    model: str,
    endpoint: str,
    block_size: int,
    kv_events: str,
    kv_events_replay: str | None = None,
) -> dict[str, object]:
    """The body of ``POST /workers`` for one replica (data-parallel rank 0 publishes at ``kv_events``)."""
    body: dict[str, object] = {
        "worker_id": worker_id,
        "model_name": model,
        "endpoint": endpoint,
        "block_size": block_size,
        "kv_events_endpoints": {"0": kv_events},
    }
    if kv_events_replay is not None:
        body["replay_endpoint"] = kv_events_replay
    return body


def post_json(url: str, body: dict[str, object], timeout_s: float = 10.0) -> object:
    """POST ``body`` and return the decoded answer; raises ``OSError`` (urllib's errors) on failure."""
    request = urllib.request.Request(
        url, data=orjson.dumps(body), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return orjson.loads(response.read())


def register_worker(service_url: str, registration: dict[str, object]) -> None:
    post_json(f"{service_url}/workers", registration)
