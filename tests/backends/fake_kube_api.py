"""A Kubernetes API server for discovery tests: Pods (``/api/v1``) and InferencePools
(``/apis/inference.networking.k8s.io/v1``) of namespaces, in memory, over aiohttp on loopback.

No kube-apiserver can be installed here (not in Debian 12, not on PyPI), so this serves the parts
of the API that list-then-watch uses, with the shapes the API documents
(https://kubernetes.io/docs/reference/using-api/api-concepts/): ``*List`` objects with
``metadata.resourceVersion``; ``?watch=true`` streams of ``{"type", "object"}`` JSON lines from a
``resourceVersion``; ``labelSelector`` (``k=v,…``) and ``fieldSelector`` (``metadata.name=…``)
filters, where an object that stops matching a watch's selector reaches it as ``DELETED`` and one
that starts matching as ``ADDED``, as the watch cache sends them; ``BOOKMARK`` events when
``allowWatchBookmarks=true``; after ``compact()``, a watch from an older version gets the ``ERROR``
event with a 410 ``Status`` (reason ``Expired``) and a list from one gets HTTP 410; ``timeoutSeconds``
ends a watch; requests without the bearer token get 401 and ``forbid()`` answers 403 with the
``Status`` the real server writes. Every request is recorded (``requests``) for assertions.
"""

import asyncio
import contextlib
import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from bench.harness.processes import free_port

ApiObject = dict[str, Any]
TOKEN = "kvgate-test-token"
POOLS = "inferencepools"
PODS = "pods"
KINDS = {PODS: ("Pod", "v1"), POOLS: ("InferencePool", "inference.networking.k8s.io/v1")}


@dataclass
class Change:
    version: int
    resource: str
    namespace: str
    before: ApiObject | None
    after: ApiObject | None


@dataclass
class Watcher:
    resource: str
    namespace: str
    matches: Callable[[ApiObject], bool]
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)


def status(code: int, reason: str, message: str) -> ApiObject:
    """A ``Status`` object as the API server writes it for a failure."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


def selector(query: dict[str, str]) -> Callable[[ApiObject], bool]:
    """The ``labelSelector`` (equality terms) and ``fieldSelector`` (``metadata.name``) of a request."""
    labels = dict(term.split("=", 1) for term in query.get("labelSelector", "").split(",") if term)
    fields = dict(term.split("=", 1) for term in query.get("fieldSelector", "").split(",") if term)
    assert set(fields) <= {"metadata.name"}, f"field selector not served here: {fields}"

    def matches(obj: ApiObject) -> bool:
        metadata = obj["metadata"]
        if "metadata.name" in fields and metadata["name"] != fields["metadata.name"]:
            return False
        return all((metadata.get("labels") or {}).get(key) == value for key, value in labels.items())

    return matches


class FakeKubeApi:
    """The server's state and handlers; mutate it from its own event loop (or through ``KubeApiThread``)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], ApiObject] = {}
        self.version = 1
        self.compacted = 0
        """Versions at or below this one are gone: watching from them answers 410."""
        self.history: list[Change] = []
        self.watchers: list[Watcher] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.forbidden = False
        self.bookmark_every_s = 0.2

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self.handle)
        app.router.add_get("/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/inferencepools", self.handle)
        return app

    # The test's side: objects come and go.

    def put(self, resource: str, obj: ApiObject) -> None:
        """Create or replace ``obj`` (ADDED or MODIFIED)."""
        obj = copy.deepcopy(obj)
        kind, api_version = KINDS[resource]
        metadata = obj["metadata"]
        key = (resource, metadata.setdefault("namespace", "default"), metadata["name"])
        before = self.objects.get(key)
        metadata["uid"] = before["metadata"]["uid"] if before else f"uid-{resource}-{metadata['name']}-{self.version}"
        metadata.setdefault("creationTimestamp", "2026-12-01T00:00:00Z")
        self._commit(resource, key, before, {"kind": kind, "apiVersion": api_version, **obj})

    def delete(self, resource: str, name: str, namespace: str = "default") -> None:
        key = (resource, namespace, name)
        self._commit(resource, key, self.objects[key], None)

    def compact(self) -> None:
        """Forget every version up to now (as etcd compaction does) and end the open watches: a
        client that watches again from the version it had gets 410 and must list again."""
        self.compacted = self.version
        self.drop_watches()

    def drop_watches(self) -> None:
        for watcher in self.watchers:
            watcher.queue.put_nowait(None)

    def _commit(
        self, resource: str, key: tuple[str, str, str], before: ApiObject | None, after: ApiObject | None
    ) -> None:
        self.version += 1
        if after is not None:
            after["metadata"]["resourceVersion"] = str(self.version)
            self.objects[key] = after
        else:
            del self.objects[key]
            assert before is not None
            before = copy.deepcopy(before)
            before["metadata"]["resourceVersion"] = str(self.version)
        change = Change(self.version, resource, key[1], before, after)
        self.history.append(change)
        for watcher in self.watchers:
            if watcher.resource == resource and watcher.namespace == key[1]:
                watcher.queue.put_nowait(change)

    # The API's side.

    async def handle(self, request: web.Request) -> web.StreamResponse:
        resource = request.path.rsplit("/", 1)[1]
        namespace = request.match_info["namespace"]
        query = dict(request.query)
        self.requests.append((request.path, query))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)
        if self.forbidden:
            message = (f'{resource} is forbidden: User "system:serviceaccount:{namespace}:kvgate-epp" cannot '
                       f'list resource "{resource}" in API group "" in the namespace "{namespace}"')  # fmt: skip
            return web.json_response(status(403, "Forbidden", message), status=403)
        if query.get("watch") == "true":
            return await self.watch(request, resource, namespace, query)
        return self.list(resource, namespace, query)

    def list(self, resource: str, namespace: str, query: dict[str, str]) -> web.Response:
        asked = int(query.get("resourceVersion") or 0)
        if asked and asked <= self.compacted:
            return web.json_response(status(410, "Expired", f"too old resource version: {asked}"), status=410)
        matches = selector(query)
        items = [obj for (kind, ns, _), obj in sorted(self.objects.items()) if (kind, ns) == (resource, namespace)]
        kind, api_version = KINDS[resource]
        listing = {"kind": f"{kind}List", "apiVersion": api_version,
                   "metadata": {"resourceVersion": str(self.version)}, "items": [obj for obj in items if matches(obj)]}  # fmt: skip
        return web.Response(body=orjson.dumps(listing), content_type="application/json")

    async def watch(
        self, request: web.Request, resource: str, namespace: str, query: dict[str, str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        with contextlib.suppress(ConnectionResetError):  # the client went away
            await self.stream(request, response, resource, namespace, query)
        return response

    async def stream(
        self, request: web.Request, response: web.StreamResponse, resource: str, namespace: str, query: dict[str, str]
    ) -> None:
        since = int(query.get("resourceVersion") or 0)
        await response.prepare(request)
        if since <= self.compacted:
            expired = status(410, "Expired", f"too old resource version: {since} ({self.compacted + 1})")
            await response.write(orjson.dumps({"type": "ERROR", "object": expired}) + b"\n")
            return
        watcher = Watcher(resource, namespace, selector(query))
        for change in self.history:
            if change.version > since and (change.resource, change.namespace) == (resource, namespace):
                watcher.queue.put_nowait(change)
        self.watchers.append(watcher)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        deadline = asyncio.get_running_loop().time() + int(query.get("timeoutSeconds") or 1800)
        try:
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    change = await asyncio.wait_for(watcher.queue.get(), min(left, self.bookmark_every_s))
                except TimeoutError:
                    if bookmarks:
                        await response.write(orjson.dumps(self.bookmark(resource)) + b"\n")
                    continue
                if change is None:
                    break
                event = self.event(watcher, change)
                if event is not None:
                    await response.write(orjson.dumps(event) + b"\n")
        finally:
            self.watchers.remove(watcher)

    def bookmark(self, resource: str) -> ApiObject:
        kind, api_version = KINDS[resource]
        return {"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                                               "metadata": {"resourceVersion": str(self.version)}}}  # fmt: skip

    @staticmethod
    def event(watcher: Watcher, change: Change) -> ApiObject | None:
        """The event a watch with ``watcher``'s selector sees for ``change``, if any."""
        was = change.before is not None and watcher.matches(change.before)
        now = change.after is not None and watcher.matches(change.after)
        if now:
            return {"type": "MODIFIED" if was else "ADDED", "object": change.after}
        if was:
            gone = change.after if change.after is not None else change.before
            return {"type": "DELETED", "object": gone}
        return None


class KubeApiThread:
    """``FakeKubeApi`` served on 127.0.0.1 from a thread of its own, for tests whose gateway is
    another process; every call runs on the server's loop and waits for it."""

    def __init__(self) -> None:
        self.api = FakeKubeApi()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-kube-api", daemon=True)
        self._thread.start()
        assert self._started.wait(30), "the fake API server did not start"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(self.api.app())
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._runner = runner
        self._started.set()
        self._loop.run_forever()

    def call(self, method: Callable[..., Any], *args: Any) -> Any:
        async def run() -> Any:
            return method(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def stop(self) -> None:
        self.call(self.api.drop_watches)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


def kubeconfig(url: str, namespace: str = "default") -> str:
    """A kubeconfig (YAML) that reaches ``url`` with the server's bearer token."""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {{server: "{url}"}}
users:
- name: kvgate
  user: {{token: {TOKEN}}}
contexts:
- name: fake
  context: {{cluster: fake, user: kvgate, namespace: {namespace}}}
current-context: fake
"""


def pod(name: str, address: str | None, labels: dict[str, str], ready: bool = True) -> ApiObject:
    """A Pod as the API serves one (the fields the kubelet and scheduler fill in included)."""
    conditions = [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-12-01T00:00:01Z"},
        {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"},
        {"type": "Ready", "status": str(ready), "lastTransitionTime": "2026-12-01T00:00:05Z"},
        {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": "2026-12-01T00:00:05Z"},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"},
    ]
    status_: ApiObject = {"phase": "Running" if address else "Pending", "conditions": conditions,
                          "hostIP": "10.0.0.7", "hostIPs": [{"ip": "10.0.0.7"}], "qosClass": "Burstable"}  # fmt: skip
    if address:
        status_ |= {"podIP": address, "podIPs": [{"ip": address}], "startTime": "2026-12-01T00:00:00Z"}
    return {
        "metadata": {"name": name, "namespace": "default", "labels": labels, "generateName": "engine-",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "engine",
                                          "uid": "uid-sts", "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"containers": [{"name": "engine", "image": "kvgate:cpu", "args": ["engine", "--sim"],
                                 "ports": [{"containerPort": 8100, "protocol": "TCP"}]}],
                 "nodeName": "node-1", "restartPolicy": "Always", "serviceAccountName": "default"},
        "status": status_,
    }  # fmt: skip


def inference_pool(name: str, labels: dict[str, str], ports: list[int]) -> ApiObject:
    """An InferencePool (GIE v1) as deploy/gie/inferencepool.yaml declares one."""
    return {
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": {"selector": {"matchLabels": labels}, "targetPorts": [{"number": port} for port in ports],
                 "endpointPickerRef": {"kind": "Service", "name": "kvgate-epp", "port": {"number": 9002},
                                       "failureMode": "FailClose"}},
    }  # fmt: skip
