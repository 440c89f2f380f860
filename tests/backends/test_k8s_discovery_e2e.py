"""Kubernetes discovery end to end: a real gateway process (`kvgate gateway`) whose config follows an
InferencePool through the API server of tests/backends/fake_kube_api.py (on loopback, in this
process: no kube-apiserver can be installed here), and real simulated engines as the pool's pods,
on 127.0.0.2 and 127.0.0.3 with the same ports, as a StatefulSet's pods have. Routing must follow
the pods as they become ready, unready and deleted, and the pool's selector as it changes; a pod
that leaves takes its prefix-index entries with it."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.fake_kube_api import PODS, POOLS, KubeApiThread, inference_pool, kubeconfig, pod
from tests.discovered_fleet import (
    MODEL,
    complete,
    engines_on,
    fleet_ports,
    healthy_backends,
    indexed_backends,
    rule_ports,
    start_discovering_gateway,
    wait_for,
)
from tests.procs import ManagedProcess, http

pytestmark = pytest.mark.slow

FIRST, SECOND = "127.0.0.2", "127.0.0.3"
STABLE = {"app.kubernetes.io/name": "kvgate-engine", "track": "stable"}
CANARY = {"app.kubernetes.io/name": "kvgate-engine", "track": "canary"}
POOL = "kvgate-pool"


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return fleet_ports()


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, ports: dict[str, int]) -> Iterator[None]:
    with engines_on((FIRST, SECOND), ports, tmp_path_factory.mktemp("k8s-engines")):
        yield


@pytest.fixture
def kube_api() -> Iterator[KubeApiThread]:
    server = KubeApiThread()
    yield server
    server.stop()


def start_pool_gateway(tmp_path: Path, kube_api: KubeApiThread, ports: dict[str, int]) -> ManagedProcess:
    config_file = tmp_path / "kubeconfig"
    config_file.write_text(kubeconfig(kube_api.url))
    rule = {
        "name": "engine",
        "inference_pool": POOL,
        "namespace": "default",
        "kubeconfig": str(config_file),
        **rule_ports(ports),
    }
    return start_discovering_gateway(tmp_path, {"kubernetes": [rule]})


def name(address: str) -> str:
    return f"engine-{address}"


def test_routing_follows_the_pools_ready_pods_and_its_selector(
    tmp_path: Path, engines: None, kube_api: KubeApiThread, ports: dict[str, int]
) -> None:
    def put(resource: str, obj: dict) -> None:
        kube_api.call(kube_api.api.put, resource, obj)

    put(POOLS, inference_pool(POOL, {"app.kubernetes.io/name": "kvgate-engine"}, [ports["http"]]))
    put(PODS, pod("engine-0", FIRST, STABLE))
    put(PODS, pod("engine-1", SECOND, CANARY, ready=False))
    gateway = start_pool_gateway(tmp_path, kube_api, ports)
    try:
        assert healthy_backends(gateway) == {name(FIRST)}, "the first listing is applied before the gateway serves"
        assert {complete(gateway, seed) for seed in range(4)} == {name(FIRST)}

        put(PODS, pod("engine-1", SECOND, CANARY))
        wait_for(lambda: healthy_backends(gateway) == {name(FIRST), name(SECOND)}, "the pod that became ready")
        assert {complete(gateway, seed) for seed in range(10, 26)} == {name(FIRST), name(SECOND)}
        wait_for(lambda: indexed_backends(gateway) == {name(FIRST), name(SECOND)}, "KV events from both")

        put(PODS, pod("engine-0", FIRST, STABLE, ready=False))
        wait_for(lambda: healthy_backends(gateway) == {name(SECOND)}, "the unready pod to leave")
        wait_for(lambda: indexed_backends(gateway) == {name(SECOND)}, "its prefix-index entries to be dropped")
        assert {complete(gateway, seed) for seed in range(4)} == {name(SECOND)}, "even prompts it had cached"

        put(PODS, pod("engine-0", FIRST, STABLE))
        wait_for(lambda: healthy_backends(gateway) == {name(FIRST), name(SECOND)}, "the pod, ready again")
        put(POOLS, inference_pool(POOL, CANARY, [ports["http"]]))
        wait_for(lambda: healthy_backends(gateway) == {name(SECOND)}, "the selector that leaves stable out")
        assert {complete(gateway, seed) for seed in range(50, 54)} == {name(SECOND)}

        kube_api.call(kube_api.api.delete, PODS, "engine-1")
        wait_for(lambda: healthy_backends(gateway) == set(), "the deleted pod to leave")
        wait_for(lambda: indexed_backends(gateway) == set(), "its prefix-index entries to be dropped")
        reply = http("POST", f"{gateway.url}/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert reply.status == 503
        assert "discovery.kubernetes engine" in gateway.log()
    finally:
        gateway.stop()
