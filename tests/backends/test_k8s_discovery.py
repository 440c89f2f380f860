"""Kubernetes discovery (gateway/backends/k8s_discovery.py) in process, against the API server of
tests/backends/fake_kube_api.py on loopback (no kube-apiserver can be installed here): the real
client (kubernetes_asyncio's kubeconfig loading and requests, our list-then-watch) follows an
InferencePool and its pods through list, watch, bookmarks, a 410 Gone, a refused list and an API
server that goes away and comes back."""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from bench.harness.processes import free_port
from gateway.backends import k8s_discovery
from gateway.backends.discovery_config import KubernetesDiscovery
from gateway.backends.k8s_discovery import KubernetesDiscoverer
from tests.backends.fake_kube_api import PODS, POOLS, FakeKubeApi, inference_pool, kubeconfig, pod

ENGINE = {"app.kubernetes.io/name": "kvgate-engine"}
POOL = "kvgate-pool"


class Served:
    """The fake API server on a loopback port of this test's loop; ``restart`` keeps its state."""

    def __init__(self, api: FakeKubeApi) -> None:
        self.api = api
        self.port = free_port()
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.runner = web.AppRunner(self.api.app(), shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        self.api.drop_watches()
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    server = Served(FakeKubeApi())
    await server.start()
    yield server
    await server.stop()


class Recorder:
    """A discoverer's ``on_change``: counts the calls and keeps the backend URLs each one saw."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[set[str]] = []
        self.discoverer: KubernetesDiscoverer | None = None

    async def __call__(self) -> None:
        self.calls += 1
        if self.discoverer is not None:
            self.seen.append(urls(self.discoverer))


def rule(tmp_path: Path, served: Served) -> KubernetesDiscovery:
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig(f"http://127.0.0.1:{served.port}"))
    return KubernetesDiscovery(name="engine", inference_pool=POOL, kubeconfig=str(path), kv_events_port=5557)


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def urls(discoverer: KubernetesDiscoverer) -> set[str]:
    return {backend.url for backend in discoverer.backends}


@pytest.fixture
async def discovering(tmp_path: Path, served: Served) -> AsyncIterator[tuple[KubernetesDiscoverer, Recorder]]:
    served.api.put(POOLS, inference_pool(POOL, ENGINE, [8100]))
    served.api.put(PODS, pod("engine-0", "10.1.0.1", ENGINE))
    recorder = Recorder()
    discoverer = KubernetesDiscoverer(recorder)
    recorder.discoverer = discoverer
    discoverer.configure([rule(tmp_path, served)])
    await discoverer.start()
    yield discoverer, recorder
    await discoverer.stop()


async def test_start_lists_the_pool_and_its_ready_pods_then_watches_them(tmp_path: Path, served: Served) -> None:
    api = served.api
    api.put(POOLS, inference_pool(POOL, ENGINE, [8100]))
    api.put(POOLS, inference_pool("another-pool", {"app": "other"}, [9000]))
    api.put(PODS, pod("engine-0", "10.1.0.1", ENGINE))
    api.put(PODS, pod("engine-1", "10.1.0.2", ENGINE, ready=False))
    api.put(PODS, pod("engine-2", None, ENGINE))
    api.put(PODS, pod("other-0", "10.1.0.9", {"app": "other"}))
    recorder = Recorder()
    discoverer = KubernetesDiscoverer(recorder)
    discoverer.configure([rule(tmp_path, served)])
    try:
        await discoverer.start()
        assert urls(discoverer) == {"http://10.1.0.1:8100"}, "known before the gateway serves"
        (backend,) = discoverer.backends
        assert (backend.name, backend.kv_events) == ("engine-10.1.0.1", "tcp://10.1.0.1:5557")
        assert recorder.calls >= 1
        await until(lambda: sum(query.get("watch") == "true" for _, query in api.requests) == 2, "both watches")
    finally:
        await discoverer.stop()
    pool_list, pool_watch, pod_list, pod_watch = (
        next(
            query for path, query in api.requests if path.endswith(resource) and (query.get("watch") == "true") == watch
        )
        for resource, watch in ((POOLS, False), (POOLS, True), (PODS, False), (PODS, True))
    )
    assert pool_list == {"fieldSelector": f"metadata.name={POOL}"}
    assert pod_list == {"labelSelector": "app.kubernetes.io/name=kvgate-engine"}
    assert pod_watch["allowWatchBookmarks"] == "true" and pool_watch["allowWatchBookmarks"] == "true"
    assert int(pod_watch["resourceVersion"]) == api.version, "watched from the list's version"
    assert int(pod_watch["timeoutSeconds"]) > 0


async def test_pods_join_when_ready_and_leave_when_unready_terminating_deleted_or_relabelled(
    served: Served, discovering: tuple[KubernetesDiscoverer, Recorder]
) -> None:
    discoverer, recorder = discovering
    api = served.api
    api.put(PODS, pod("engine-1", None, ENGINE))
    api.put(PODS, pod("engine-1", "10.1.0.2", ENGINE, ready=False))
    await asyncio.sleep(0.3)
    assert urls(discoverer) == {"http://10.1.0.1:8100"}, "a pod that is not ready is no replica"
    calls = recorder.calls
    api.put(PODS, pod("engine-1", "10.1.0.2", ENGINE))
    await until(lambda: urls(discoverer) == {"http://10.1.0.1:8100", "http://10.1.0.2:8100"}, "the ready pod")
    await until(lambda: recorder.calls > calls, "on_change")

    api.put(PODS, pod("engine-1", "10.1.0.2", ENGINE, ready=False))
    await until(lambda: urls(discoverer) == {"http://10.1.0.1:8100"}, "the unready pod to leave")
    api.put(PODS, pod("engine-1", "10.1.0.2", ENGINE))
    await until(lambda: len(discoverer.backends) == 2, "it to come back")
    terminating = pod("engine-1", "10.1.0.2", ENGINE)
    terminating["metadata"]["deletionTimestamp"] = "2026-12-01T00:10:00Z"
    api.put(PODS, terminating)
    await until(lambda: urls(discoverer) == {"http://10.1.0.1:8100"}, "the terminating pod to leave")
    api.delete(PODS, "engine-1")
    api.put(PODS, pod("engine-0", "10.1.0.1", {"app.kubernetes.io/name": "something-else"}))
    await until(lambda: discoverer.backends == [], "the relabelled pod to leave (DELETED by its selector)")


async def test_selector_and_target_port_changes_on_the_pool_are_followed(
    served: Served, discovering: tuple[KubernetesDiscoverer, Recorder]
) -> None:
    discoverer, recorder = discovering
    api = served.api
    canary = {"app.kubernetes.io/name": "kvgate-engine", "track": "canary"}
    api.put(PODS, pod("canary-0", "10.1.0.7", canary))
    await until(lambda: len(discoverer.backends) == 2, "the canary, which the selector also matches")
    applied = len(recorder.seen)
    api.put(POOLS, inference_pool(POOL, canary, [8100]))
    await until(lambda: urls(discoverer) == {"http://10.1.0.7:8100"}, "the narrower selector")
    await until(lambda: len(recorder.seen) > applied, "on_change")
    assert all("http://10.1.0.7:8100" in seen for seen in recorder.seen[applied:]), "a pod both select stays"
    assert (
        "/api/v1/namespaces/default/pods",
        {"labelSelector": "app.kubernetes.io/name=kvgate-engine,track=canary"},
    ) in (api.requests), "a new list (and watch) with the new selector"

    api.put(POOLS, inference_pool(POOL, canary, [8000, 8001]))
    await until(lambda: len(discoverer.backends) == 2, "one backend per target port")
    assert [(backend.name, backend.kv_events) for backend in discoverer.backends] == [
        ("engine-10.1.0.7-8000", "tcp://10.1.0.7:5557"),
        ("engine-10.1.0.7-8001", "tcp://10.1.0.7:5558"),
    ]
    api.delete(POOLS, POOL)
    await until(lambda: discoverer.backends == [], "a deleted pool: no replica")
    api.put(POOLS, inference_pool(POOL, ENGINE, [8100]))
    await until(lambda: len(discoverer.backends) == 2, "the pool again")


async def test_bookmarks_move_the_watch_on_and_a_410_lists_again(
    served: Served, discovering: tuple[KubernetesDiscoverer, Recorder]
) -> None:
    discoverer, _ = discovering
    api = served.api
    for index in range(5):
        api.put(PODS, pod(f"unrelated-{index}", "10.9.0.1", {"app": "unrelated"}))
    version = api.version
    await asyncio.sleep(3 * api.bookmark_every_s)
    api.drop_watches()

    def watched_from() -> list[int]:
        return [
            int(query["resourceVersion"]) for path, query in api.requests if path.endswith(PODS) and "watch" in query
        ]

    await until(lambda: len(watched_from()) >= 2, "a new pod watch")
    assert watched_from()[-1] == version, "from the last bookmark's version, not the list's"

    lists = sum(path.endswith(PODS) and "watch" not in query for path, query in api.requests)
    api.compact()
    api.put(PODS, pod("engine-5", "10.1.0.5", ENGINE))
    await until(lambda: urls(discoverer) == {"http://10.1.0.1:8100", "http://10.1.0.5:8100"}, "the relisted pods")
    assert sum(path.endswith(PODS) and "watch" not in query for path, query in api.requests) == lists + 1


async def test_an_api_server_that_goes_away_keeps_the_last_replicas(
    served: Served, discovering: tuple[KubernetesDiscoverer, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    discoverer, _ = discovering
    await served.stop()
    caplog.set_level(logging.WARNING, "kvgate.discovery")
    await until(lambda: "retrying in" in caplog.text, "a failed watch")
    assert urls(discoverer) == {"http://10.1.0.1:8100"}
    served.api.put(PODS, pod("engine-3", "10.1.0.3", ENGINE))
    await served.start()
    await until(lambda: len(discoverer.backends) == 2, "the change made while it was away")


async def test_a_refused_list_is_logged_and_retried(
    tmp_path: Path, served: Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(k8s_discovery, "START_SYNC_S", 0.5)
    served.api.put(POOLS, inference_pool(POOL, ENGINE, [8100]))
    served.api.put(PODS, pod("engine-0", "10.1.0.1", ENGINE))
    served.api.forbidden = True
    discoverer = KubernetesDiscoverer(Recorder())
    discoverer.configure([rule(tmp_path, served)])
    caplog.set_level(logging.WARNING, "kvgate.discovery")
    try:
        await discoverer.start()
        assert discoverer.backends == []
        assert 'cannot list resource "inferencepools"' in caplog.text, "the API server's reason, for the RBAC fix"
        served.api.forbidden = False
        await until(lambda: len(discoverer.backends) == 1, "the list once allowed")
    finally:
        await discoverer.stop()


async def test_missing_credentials_are_an_error_that_does_not_hold_start_up(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    discoverer = KubernetesDiscoverer(Recorder())
    discoverer.configure([KubernetesDiscovery(name="engine", inference_pool=POOL)])
    discoverer.configure([KubernetesDiscovery(name="other", inference_pool=POOL, kubeconfig="/nonexistent")])
    discoverer.configure(
        [
            KubernetesDiscovery(name="engine", inference_pool=POOL),
            KubernetesDiscovery(name="other", inference_pool=POOL, kubeconfig="/nonexistent"),
        ]
    )
    try:
        await asyncio.wait_for(discoverer.start(), 5)
        assert discoverer.backends == []
        assert "in-cluster config (service account)" in caplog.text and "kubeconfig /nonexistent" in caplog.text
    finally:
        await discoverer.stop()
