"""Kubernetes discovery (``discovery.kubernetes``): a rule's replicas are the ready Pods its
InferencePool selects, one backend per pod and target port, followed through the Kubernetes API
(list, then watch) without a restart.

Each rule watches its InferencePool (by name) and, through the pool's ``spec.selector``, the pods
it selects; a changed selector starts a new pod watch, changed ``targetPorts`` re-derive the
backends, a deleted pool means no replica. Every change hands the whole discovered set to
``on_change``, as DNS discovery does (a new pod joins once its health check passes, a gone or
unready one drains and the router forgets its prefix-index entries); a burst of watch events is
applied once. A failing API server keeps the last answer: the watches retry with backoff.
"""

import asyncio
import importlib
import logging
import sys
from collections.abc import Awaitable, Callable

from gateway.backends.discovery_config import KubernetesDiscovery
from gateway.backends.k8s_pool import PoolSpec, backends_for, pool_spec, ready_address
from gateway.backends.k8s_watch import ApiObject, Backoff, KubeApi, KubeConfigError, list_then_watch
from gateway.config import BackendSpec

log = logging.getLogger("kvgate.discovery")

START_SYNC_S = 10.0
"""How long start-up waits for each rule's first listing before serving without it."""
API_MODULE = "gateway.backends.k8s_api"


async def connect(rule: KubernetesDiscovery) -> tuple[KubeApi, str]:
    """The API client for ``rule`` and its namespace. The client module imports kubernetes_asyncio
    (about a second of CPU), so the first call imports it in a thread, off the event loop."""
    if API_MODULE not in sys.modules:
        await asyncio.to_thread(importlib.import_module, API_MODULE)
    from gateway.backends.k8s_api import RestApi

    api = await RestApi.connect(rule)
    return api, api.namespace


class PoolFollower:
    """One rule: its InferencePool, the pods that pool selects, and the backends they make."""

    def __init__(self, rule: KubernetesDiscovery, changed: Callable[[], None]) -> None:
        self.rule = rule
        self._changed = changed
        self.synced = asyncio.Event()
        """Set once the first attempt to list the pool and its pods is over (done or failed)."""
        self.backends: list[BackendSpec] = []
        self._spec: PoolSpec | None = None
        self._pods: dict[str, str | None] = {}
        """Each selected pod's name and its address while it is ready."""
        self._pods_task: asyncio.Task[None] | None = None
        self._api: KubeApi | None = None
        self._namespace = ""

    async def run(self) -> None:
        """Follow the pool until cancelled."""
        backoff = Backoff()
        while self._api is None:
            try:
                self._api, self._namespace = await connect(self.rule)
            except KubeConfigError as exc:
                log.error("discovery.kubernetes %s: no access to the Kubernetes API: %s", self.rule.name, exc)
                self.synced.set()
                await backoff.wait()
        path = f"/apis/inference.networking.k8s.io/v1/namespaces/{self._namespace}/inferencepools"
        params = {"fieldSelector": f"metadata.name={self.rule.inference_pool}"}
        try:
            await list_then_watch(
                self._api, path, params, self._on_pools, self._on_pool_event, self._what("inferencepool")
            )
        finally:
            self._stop_pods()
            await self._api.close()

    def _what(self, kind: str) -> str:
        """How logs name this rule's ``kind`` of watch."""
        return f"{self.rule.name}, {kind} {self._namespace}/{self.rule.inference_pool}"

    def _on_pools(self, pools: list[ApiObject]) -> None:
        self._set_pool(pools[0] if pools else None)

    def _on_pool_event(self, kind: str, pool: ApiObject) -> None:
        self._set_pool(None if kind == "DELETED" else pool)

    def _set_pool(self, pool: ApiObject | None) -> None:
        spec = pool_spec(pool) if pool is not None else None
        if pool is None:
            log.warning("discovery.kubernetes %s: not found: no replica", self._what("inferencepool"))
        elif spec is None:
            log.warning("discovery.kubernetes %s: no selector or target port: no replica", self._what("inferencepool"))
        if spec == self._spec and self._pods_task is not None:
            return
        selector_changed = spec is None or self._spec is None or spec.match_labels != self._spec.match_labels
        self._spec = spec
        if spec is not None:
            log.info(
                "discovery.kubernetes %s: pods %s, target ports %s",
                self.rule.name,
                spec.label_selector,
                ", ".join(map(str, spec.target_ports)),
            )
        if selector_changed:
            self._stop_pods()
            if spec is not None:
                self._start_pods(spec)
            else:
                self._pods = {}
                self.synced.set()
        self._update()

    def _start_pods(self, spec: PoolSpec) -> None:
        assert self._api is not None
        watch = list_then_watch(
            self._api,
            f"/api/v1/namespaces/{self._namespace}/pods",
            {"labelSelector": spec.label_selector},
            self._on_pods,
            self._on_pod_event,
            self._what("the pods of inferencepool"),
        )
        self._pods_task = asyncio.get_running_loop().create_task(watch, name=f"discovery.kubernetes {self.rule.name}")

    def _stop_pods(self) -> None:
        if self._pods_task is not None:
            self._pods_task.cancel()
            self._pods_task = None

    def _on_pods(self, pods: list[ApiObject]) -> None:
        """A (re)listing: it replaces what the last one, or the last selector's, found, so a pod that
        both selectors match stays without a pause."""
        self._pods = {pod["metadata"]["name"]: ready_address(pod) for pod in pods}
        self.synced.set()
        self._update()

    def _on_pod_event(self, kind: str, pod: ApiObject) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = ready_address(pod)
        self._update()

    def _update(self) -> None:
        addresses = [address for address in self._pods.values() if address is not None]
        found = backends_for(self.rule, self._spec, addresses) if self._spec is not None else []
        if found == self.backends:
            return
        self.backends = found
        log.info(
            "discovery.kubernetes %s: %s",
            self.rule.name,
            ", ".join(backend.url for backend in found) or "no ready pod",
        )
        self._changed()


class KubernetesDiscoverer:
    """Follows every ``discovery.kubernetes`` rule, one task each; ``backends`` is what they found."""

    def __init__(self, on_change: Callable[[], Awaitable[None]]) -> None:
        self.on_change = on_change
        """Called (awaited) after ``backends`` changed; changes that arrive meanwhile make one more call."""
        self._followers: dict[str, PoolFollower] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._dirty = asyncio.Event()
        self._notifier: asyncio.Task[None] | None = None
        self._running = False

    @property
    def backends(self) -> list[BackendSpec]:
        return [backend for follower in self._followers.values() for backend in follower.backends]

    def configure(self, rules: list[KubernetesDiscovery]) -> None:
        """Adopt a (reloaded) config's rules: a changed or removed rule forgets what it found, an
        unchanged one keeps it; call ``on_change`` after if ``backends`` may have changed."""
        wanted = {rule.name: rule for rule in rules}
        for name, follower in list(self._followers.items()):
            if wanted.get(name) != follower.rule:
                self._stop_task(name)
                del self._followers[name]
        for name, rule in wanted.items():
            if name not in self._followers:
                self._followers[name] = PoolFollower(rule, self._dirty.set)
                if self._running:
                    self._start_task(name)

    async def start(self) -> None:
        """Start every rule and wait (at most ``START_SYNC_S``) for their first listings, so the first
        backends are known before serving."""
        self._running = True
        if not self._followers:
            return
        for name in self._followers:
            self._start_task(name)
        waits = [follower.synced.wait() for follower in self._followers.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), START_SYNC_S)
        except TimeoutError:
            log.warning("discovery.kubernetes: serving before every pool was listed (API server slow or unreachable)")
        self._dirty.clear()
        await self.on_change()

    async def stop(self) -> None:
        self._running = False
        tasks = [*self._tasks.values(), *([self._notifier] if self._notifier else [])]
        for name in list(self._tasks):
            self._stop_task(name)
        if self._notifier is not None:
            self._notifier.cancel()
            self._notifier = None
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_task(self, name: str) -> None:
        if self._notifier is None:
            self._notifier = asyncio.get_running_loop().create_task(self._notify(), name="discovery.kubernetes notify")
        self._tasks[name] = asyncio.get_running_loop().create_task(
            self._followers[name].run(), name=f"discovery.kubernetes {name}"
        )

    def _stop_task(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def _notify(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.on_change()
            except Exception:
                log.exception("discovery.kubernetes: applying the new backends failed")
