"""The Kubernetes API as Kubernetes discovery uses it: GET a collection as JSON, or watch it as a
stream of JSON lines. ``kubernetes_asyncio`` loads the credentials (the pod's service account in
cluster, with its token re-read as it rotates; or a kubeconfig, with client certificates, tokens or
exec plugins) and makes the requests over aiohttp. Its typed models are not used: deserializing a
Pod into them costs milliseconds, so objects stay the API's JSON (parsed with orjson) and only the
fields discovery reads are looked at.

This module imports all of ``kubernetes_asyncio`` (about a second): k8s_discovery imports it off
the event loop, and only when a ``discovery.kubernetes`` rule is configured.
"""

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration

from gateway.backends.discovery_config import KubernetesDiscovery
from gateway.backends.k8s_watch import WATCH_TIMEOUT_S, ApiObject, KubeConfigError, api_error

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LIST_TIMEOUT = aiohttp.ClientTimeout(total=30, sock_connect=10)
WATCH_TIMEOUT = aiohttp.ClientTimeout(total=WATCH_TIMEOUT_S + 30, sock_connect=10)
"""A watch the server does not end by its ``timeoutSeconds`` (a silently dead connection) ends here."""


class RestApi:
    """One API server, as a rule's credentials reach it."""

    def __init__(self, client: ApiClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        """The rule's namespace, or the default its credentials name."""

    @classmethod
    async def connect(cls, rule: KubernetesDiscovery) -> "RestApi":
        configuration = Configuration()
        try:
            if rule.kubeconfig is not None:
                loader = await kube_config.load_kube_config(
                    str(Path(rule.kubeconfig).expanduser()), rule.context, configuration, persist_config=False
                )
                context = (loader.current_context or {}).get("context") or {}
                namespace = rule.namespace or context.get("namespace") or "default"
            else:
                kube_config.load_incluster_config(configuration)
                namespace = rule.namespace or _service_account_namespace()
        except (kube_config.ConfigException, OSError) as exc:
            where = f"kubeconfig {rule.kubeconfig}" if rule.kubeconfig else "in-cluster config (service account)"
            raise KubeConfigError(f"{where}: {exc}") from None
        return cls(ApiClient(configuration), namespace)

    async def close(self) -> None:
        await self.client.close()

    async def list(self, path: str, params: dict[str, str]) -> ApiObject:
        response = await self._get(path, params, LIST_TIMEOUT)
        async with response:
            if response.status >= 300:
                raise await _refusal(response)
            body: ApiObject = orjson.loads(await response.read())
            return body

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[ApiObject]:
        response = await self._get(path, {**params, "watch": "true"}, WATCH_TIMEOUT)
        async with response:
            if response.status >= 300:
                raise await _refusal(response)
            async for line in response.content:
                if line.strip():
                    yield orjson.loads(line)

    async def _get(self, path: str, params: dict[str, str], timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        response: aiohttp.ClientResponse = await self.client.call_api(
            path,
            "GET",
            query_params=list(params.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )
        return response


async def _refusal(response: aiohttp.ClientResponse) -> Exception:
    """The error for a non-2xx answer, with the message of its ``Status`` body when it has one."""
    try:
        body = orjson.loads(await response.read())
    except ValueError:
        body = None
    return api_error(response.status, body if isinstance(body, dict) else None)


def _service_account_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"
