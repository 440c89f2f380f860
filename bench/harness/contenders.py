"""The systems under test, each started on fresh simulated replicas (or on given replicas).

A contender is kvgate with one routing policy, the ``sglang-router`` peer with one policy,
NVIDIA Dynamo's KV router (``dynamo``: its select_service fed by the replicas' KV events, behind
``bench/peers/dynamo_proxy.py``), or the client round-robining over the replicas directly (no
gateway). ``deploy`` starts the replicas,
then the contender in front of them, and stops everything afterwards. Given replicas (real
engines) are not restarted: their prefix caches are reset through ``POST /reset_prefix_cache``.
"""

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import orjson
import yaml

from bench.harness.loadgen import Target
from bench.harness.processes import (
    REPO,
    Process,
    free_port,
    http_body,
    http_ok,
    http_post_ok,
    kvgate_command,
    launch,
    wait_ready,
)
from bench.peers.dynamo_config import DYNAMO_DEFAULTS, DynamoConfig
from bench.peers.dynamo_service import register_worker, start_select_service, worker_registration
from gateway.routing.config import POLICIES as KVGATE_POLICIES

SGLANG_POLICIES = ("cache_aware", "round_robin")
PEERS_DIR_ENV = "KVGATE_PEERS_DIR"
MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Contender:
    kind: str
    """kvgate, sglang-router, dynamo or direct."""
    policy: str
    routing: dict[str, object] = field(default_factory=dict)
    """The router's settings: extra ``routing:`` keys for kvgate (e.g. scorer weights), the cost
    knobs for Dynamo (``DynamoConfig``'s fields, bench/peers/dynamo_config.py)."""
    label: str = ""
    instances: int = 1
    """Gateways (or routers) of this kind in front of the same replicas; the load generator spreads
    requests over them round robin, as a load balancer would."""

    @property
    def name(self) -> str:
        return self.label or f"{self.kind} {self.policy}" + (f" x{self.instances}" if self.instances > 1 else "")


@dataclass(frozen=True)
class FleetSpec:
    replicas: int
    num_blocks: int
    block_size: int = 16
    engine_args: tuple[str, ...] = ()
    """Further `kvgate engine` flags (sim cost constants)."""
    kv_events: bool = True
    """Replicas publish KV events and kvgate follows them (precise mode); else kvgate predicts."""
    given_urls: tuple[str, ...] = ()
    """Running replicas to use instead of starting simulated ones (kvgate then predicts their caches)."""

    @property
    def max_model_len(self) -> int:
        """The engine's default context (8,192), or less when the KV cache is smaller."""
        return min(8192, self.num_blocks * self.block_size)


@dataclass(frozen=True)
class Replica:
    url: str
    kv_events: str | None = None
    """ZMQ endpoint of its KV events, when it publishes them."""
    kv_events_replay: str | None = None
    load_events: str | None = None
    """ZMQ endpoint of its load reports, when it publishes them."""


@dataclass(frozen=True)
class Deployment:
    target: Target
    replica_urls: tuple[str, ...]


def peers_dir() -> Path:
    return Path(os.environ.get(PEERS_DIR_ENV, REPO.parent / "peers"))


def sglang_router_binary() -> Path:
    return peers_dir() / "sgl" / "bin" / "sglang-router"


def sglang_install_hint() -> str:
    peers = peers_dir()
    return (
        f"sglang-router not found at {sglang_router_binary()}; install it with\n"
        f"  python3 -m venv {peers}/sgl && {peers}/sgl/bin/pip install sglang-router\n"
        f"(or point {PEERS_DIR_ENV} at the folder holding sgl/)"
    )


def dynamo_python() -> Path:
    return peers_dir() / "dynamo" / "bin" / "python"


def dynamo_install_hint() -> str:
    peers = peers_dir()
    return (
        f"Dynamo's select_service not found at {dynamo_python()}; install it with\n"
        f"  python3 -m venv {peers}/dynamo && {peers}/dynamo/bin/pip install ai-dynamo-runtime==1.6.1\n"
        f"(or point {PEERS_DIR_ENV} at the folder holding dynamo/)"
    )


def dynamo_contender(config: DynamoConfig, name: str = "dynamo kv", suffix: str = "") -> Contender:
    """Dynamo's KV router with ``config``'s cost knobs, named by those it sets away from the defaults
    (between ``name`` and ``suffix``)."""
    changed = config.changed()
    label = f"{name} ({changed}){suffix}" if changed else f"{name}{suffix}"
    return Contender("dynamo", "kv", routing=dataclasses.asdict(config), label=label)


def contenders_for(
    policies: Sequence[str],
    peers: bool,
    gateways: Sequence[int] = (1,),
    dynamo: Sequence[DynamoConfig] = (DYNAMO_DEFAULTS,),
) -> list[Contender]:
    """kvgate with each policy, direct round robin, and with ``peers`` Dynamo's KV router (once per
    config in ``dynamo``) and sglang-router's policies; kvgate and sglang-router once per gateway
    count in ``gateways``."""
    chosen = list(KVGATE_POLICIES) if "all" in policies else list(policies)
    unknown = sorted(set(chosen) - set(KVGATE_POLICIES))
    if unknown:
        raise ValueError(f"unknown policies {unknown}; choose from {list(KVGATE_POLICIES)} or all")
    contenders = [Contender("kvgate", policy, instances=count) for policy in chosen for count in gateways]
    contenders.append(Contender("direct", "round_robin"))
    if peers:
        contenders += [dynamo_contender(config) for config in dynamo]
        contenders += [
            Contender("sglang-router", policy, instances=count) for policy in SGLANG_POLICIES for count in gateways
        ]
    return contenders


@contextmanager
def deploy(
    contender: Contender, fleet: FleetSpec, workdir: Path, detokenize: Callable[[Sequence[int]], str]
) -> Iterator[Deployment]:
    """Fresh replicas and the contender in front of them, stopped on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        replicas = reset_given_replicas(fleet.given_urls) if fleet.given_urls else start_replicas(fleet, workdir, stack)
        urls = tuple(replica.url for replica in replicas)
        if contender.kind == "direct":
            yield Deployment(Target(urls, MODEL), urls)
        elif contender.kind == "kvgate":
            gateways = start_kvgates(contender, fleet, replicas, workdir, stack)
            yield Deployment(Target(tuple(gateway.url for gateway in gateways), MODEL), urls)
        elif contender.kind == "sglang-router":
            routers = [
                start_sglang_router(contender, urls, workdir, index, stack) for index in range(contender.instances)
            ]
            yield Deployment(Target(tuple(router.url for router in routers), MODEL, detokenize), urls)
        elif contender.kind == "dynamo":
            proxy = start_dynamo(fleet, replicas, workdir, stack, DynamoConfig.from_settings(contender.routing))
            yield Deployment(Target((proxy.url,), MODEL), urls)
        else:
            raise ValueError(f"unknown contender kind {contender.kind!r}")


def reset_given_replicas(urls: Sequence[str]) -> list[Replica]:
    for url in urls:
        if not http_post_ok(f"{url}/reset_prefix_cache"):
            print(f"   warning: {url}/reset_prefix_cache failed; its cache is not cold", flush=True)
    return [Replica(url) for url in urls]


def start_replicas(fleet: FleetSpec, workdir: Path, stack: ExitStack) -> list[Replica]:
    """Start all simulated replicas at once, then wait for each."""
    started = []
    for index in range(fleet.replicas):
        port = free_port()
        events = f"tcp://127.0.0.1:{free_port()}" if fleet.kv_events else None
        replay = f"tcp://127.0.0.1:{free_port()}" if fleet.kv_events else None
        load = f"tcp://127.0.0.1:{free_port()}"
        command = kvgate_command(
            "engine",
            "--sim",
            "--port",
            str(port),
            "--num-blocks",
            str(fleet.num_blocks),
            "--block-size",
            str(fleet.block_size),
            "--max-model-len",
            str(fleet.max_model_len),
            "--log-level",
            "WARNING",
            *fleet.engine_args,
        )
        command += ["--load-events", load]
        if events and replay:
            command += ["--kv-events", events, "--kv-events-replay", replay]
        process = launch(command, port, workdir / f"replica-{index}.log")
        stack.callback(process.stop)
        started.append((process, Replica(process.url, events, replay, load)))
    for process, _ in started:
        wait_ready(process, partial(http_ok, f"{process.url}/health"))
    return [replica for _, replica in started]


def kvgate_config(contender: Contender, fleet: FleetSpec, replicas: Sequence[Replica], port: int) -> dict[str, object]:
    backends = []
    for index, replica in enumerate(replicas):
        backend: dict[str, object] = {
            "name": f"replica-{index}",
            "url": replica.url,
            "kv_capacity_blocks": fleet.num_blocks,
        }
        if replica.kv_events:
            backend["kv_events"] = replica.kv_events
        if replica.kv_events_replay:
            backend["kv_events_replay"] = replica.kv_events_replay
        if replica.load_events:
            backend["load_events"] = replica.load_events
        backends.append(backend)
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": MODEL,
        "tokenizer": MODEL,
        "block_size": fleet.block_size,
        "backends": backends,
        "routing": {"policy": contender.policy, **contender.routing},
    }


def start_kvgates(
    contender: Contender, fleet: FleetSpec, replicas: Sequence[Replica], workdir: Path, stack: ExitStack
) -> list[Process]:
    """``contender.instances`` gateways over the same replicas, started at once, then waited for."""
    gateways = []
    for index in range(contender.instances):
        port = free_port()
        suffix = f"-{index}" if contender.instances > 1 else ""
        config_path = workdir / f"kvgate{suffix}.yaml"
        config_path.write_text(yaml.safe_dump(kvgate_config(contender, fleet, replicas, port), sort_keys=False))
        gateway = launch(kvgate_command("gateway", "-c", str(config_path)), port, workdir / f"kvgate{suffix}.log")
        stack.callback(gateway.stop)
        gateways.append(gateway)
    for gateway in gateways:
        wait_ready(gateway, partial(_kvgate_sees_all, gateway.url, len(replicas)))
    return gateways


def _kvgate_sees_all(url: str, replicas: int) -> bool:
    body = http_body(f"{url}/health")
    return body is not None and len(orjson.loads(body).get("healthy_backends", [])) == replicas


def start_sglang_router(
    contender: Contender, replica_urls: Sequence[str], workdir: Path, index: int, stack: ExitStack
) -> Process:
    """One sglang-router instance; each has its own metrics port (a shared one makes the second panic)."""
    binary = sglang_router_binary()
    if not binary.exists():
        raise FileNotFoundError(sglang_install_hint())
    port = free_port()
    command = [
        str(binary),
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *replica_urls,
        "--policy",
        contender.policy,
        "--log-level",
        "warn",
        "--prometheus-port",
        str(free_port()),
    ]
    router = launch(command, port, workdir / f"sglang-router-{index}.log")
    stack.callback(router.stop)
    wait_ready(router, lambda: _sglang_sees_all(router.url, len(replica_urls)))
    return router


def start_dynamo(
    fleet: FleetSpec, replicas: Sequence[Replica], workdir: Path, stack: ExitStack, config: DynamoConfig
) -> Process:
    """Dynamo's select_service with ``config``'s knobs, each replica registered with its KV events, and the proxy."""
    python = dynamo_python()
    if not python.exists():
        raise FileNotFoundError(dynamo_install_hint())
    if not all(replica.kv_events for replica in replicas):
        raise RuntimeError("Dynamo's KV router needs the replicas' KV events (not --no-kv-events, not given URLs)")
    service = start_select_service(python, workdir / "dynamo-select-service.log", config)
    stack.callback(service.stop)
    for worker_id, replica in enumerate(replicas, start=1):
        assert replica.kv_events is not None
        registration = worker_registration(
            worker_id, MODEL, replica.url, fleet.block_size, replica.kv_events, replica.kv_events_replay
        )
        register_worker(service.url, registration)
    port = free_port()
    command = kvgate_command(
        "bench", "dynamo-proxy", "--port", str(port), "--select-url", service.url, "--model", MODEL
    )
    proxy = launch(command, port, workdir / "dynamo-proxy.log")
    stack.callback(proxy.stop)
    wait_ready(proxy, partial(http_ok, f"{proxy.url}/health"))
    return proxy


def _sglang_sees_all(url: str, replicas: int) -> bool:
    body = http_body(f"{url}/workers")
    if body is None:
        return False
    workers = orjson.loads(body).get("workers", [])
    return len(workers) == replicas and all(worker.get("is_healthy") for worker in workers)
