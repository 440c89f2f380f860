"""List-then-watch, as client-go's reflector does it: list a collection, then watch it from the list's
``resourceVersion``, following ``BOOKMARK``s; when the API server says that version is gone (410,
as an HTTP status or an ``ERROR`` event), list again; on any other failure wait (exponential backoff
with jitter) and watch again from the last version seen. It never returns; cancel it to stop.

See https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes.
"""

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, Protocol

import aiohttp

ApiObject = dict[str, Any]
"""One object as the API serves it in JSON (a Pod, an InferencePool, a watch event, a Status)."""

log = logging.getLogger("kvgate.discovery")

WATCH_TIMEOUT_S = 300
"""The API server ends each watch after this long (``timeoutSeconds``); we then watch again."""
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


class ApiError(Exception):
    """The API server refused a request (a status other than 2xx, or an ``ERROR`` watch event)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Gone(ApiError):
    """410: the resource version asked for is older than the API server keeps; list again."""


class KubeConfigError(Exception):
    """No credentials: not in a cluster and no kubeconfig, or a kubeconfig that cannot be used."""


def api_error(status: int, body: ApiObject | None) -> ApiError:
    """The error for a refusal, from its ``Status`` object when the server sent one."""
    message = str((body or {}).get("message") or (body or {}).get("reason") or "no message")
    return Gone(status, message) if status == 410 else ApiError(status, message)


class KubeApi(Protocol):
    """GET requests to the Kubernetes API, answered as JSON."""

    async def list(self, path: str, params: dict[str, str]) -> ApiObject: ...

    def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[ApiObject]: ...

    async def close(self) -> None: ...


class Backoff:
    def __init__(self) -> None:
        self.next_s = BACKOFF_FIRST_S

    def reset(self) -> None:
        self.next_s = BACKOFF_FIRST_S

    async def wait(self) -> None:
        await asyncio.sleep(self.next_s * random.uniform(0.8, 1.2))
        self.next_s = min(self.next_s * 2, BACKOFF_MAX_S)


async def list_then_watch(
    api: KubeApi,
    path: str,
    params: dict[str, str],
    on_list: Callable[[list[ApiObject]], None],
    on_event: Callable[[str, ApiObject], None],
    what: str,
) -> NoReturn:
    """Keep ``on_list`` (the whole collection, after each list) and ``on_event`` (``ADDED``,
    ``MODIFIED`` or ``DELETED`` and the object) up to date with ``path``, filtered by ``params``."""
    backoff = Backoff()
    version: str | None = None
    while True:
        try:
            if version is None:
                listing = await api.list(path, params)
                version = str(listing["metadata"]["resourceVersion"])
                on_list(listing.get("items") or [])
                backoff.reset()
            watch = {**params, "resourceVersion": version, "allowWatchBookmarks": "true"}
            async for event in api.watch(path, {**watch, "timeoutSeconds": str(WATCH_TIMEOUT_S)}):
                version = _apply(event, on_event)
                backoff.reset()
        except Gone as exc:
            log.info("discovery.kubernetes %s: resource version %s is gone (%s); listing again", what, version, exc)
            version = None
        except (ApiError, aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "discovery.kubernetes %s: %s failed, retrying in %.1f s: %s",
                what,
                "list" if version is None else "watch",
                backoff.next_s,
                exc or type(exc).__name__,
            )
            await backoff.wait()


def _apply(event: ApiObject, on_event: Callable[[str, ApiObject], None]) -> str:
    """Hand one watch event on; the resource version to watch from after it."""
    kind, obj = event["type"], event["object"]
    if kind == "ERROR":
        raise api_error(int(obj.get("code") or 500), obj)
    if kind != "BOOKMARK":
        on_event(kind, obj)
    return str(obj["metadata"]["resourceVersion"])
