"""Config hot reload: SIGHUP or `POST /admin/reload` re-reads the config file and applies it live.

The new file is validated whole before anything changes; a broken one is refused with its
error and the running config stays. What applying it changes is `Gateway.apply`'s job. In-flight
and queued requests are never dropped.

A file that is empty, comment-only or cut off mid-write (no final newline) is always refused. A
valid file that would remove every backend or turn authentication off (no tenants where there
were some, no admin key where there was one) is refused too, unless the reload says so
explicitly: `POST /admin/reload?allow=no_backends,no_auth`. SIGHUP carries no such flag, so a
half-written file can never open the gateway through it (``reload_guard.py``).
"""

import asyncio
import logging
from pathlib import Path

import orjson
from aiohttp import web

from gateway.config import ConfigError, KvgateConfig, load_config
from gateway.errors import OpenAIError
from gateway.wiring.reload_guard import ReloadAllowance, UnsafeReload, check_safe, parse_allowance
from gateway.wiring.state import GATEWAY, Gateway

log = logging.getLogger("kvgate.reload")

CONFIG_PATH = web.AppKey("config_path", Path)

_one_at_a_time = asyncio.Lock()
_signal_reloads: set[asyncio.Task] = set()


async def reload_config(gateway: Gateway, path: Path, allow: ReloadAllowance = frozenset()) -> KvgateConfig:
    """Load ``path`` and apply it to the running gateway; ConfigError (UnsafeReload included)
    leaves everything as it was."""
    async with _one_at_a_time:
        config = load_config(path, whole_file=True)
        check_safe(gateway.config, config, str(path), allow)
        await gateway.apply(config, str(path))
    log.info("config %s reloaded: %d backends, %d tenants", path, len(config.backends), len(config.tenants))
    return config


async def reload_endpoint(request: web.Request) -> web.Response:
    """`POST /admin/reload[?allow=...]`: 200 with the backends now configured, or 400 with the
    config's error (`invalid_config`) or what it would have turned off (`unsafe_reload`)."""
    gateway = request.config_dict[GATEWAY]
    path = request.config_dict.get(CONFIG_PATH)
    if path is None:
        raise OpenAIError(409, "This gateway was not started from a config file.", code="no_config_file")
    allow = parse_allowance(request.query.getall("allow", []))
    try:
        config = await reload_config(gateway, path, allow)
    except UnsafeReload as exc:
        raise OpenAIError(400, str(exc), param="allow", code="unsafe_reload") from None
    except ConfigError as exc:
        raise OpenAIError(400, str(exc), code="invalid_config") from None
    body = {"status": "reloaded", "backends": [backend.name for backend in config.backends]}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def reload_on_signal(app: web.Application) -> None:
    """SIGHUP: start a reload in the background (the task is kept until it ends)."""
    task = asyncio.get_running_loop().create_task(_reload_logged(app))
    _signal_reloads.add(task)
    task.add_done_callback(_signal_reloads.discard)


async def _reload_logged(app: web.Application) -> None:
    """Reload, logging the outcome (there is nobody to answer)."""
    path = app.get(CONFIG_PATH)
    if path is None:
        log.warning("SIGHUP ignored: the gateway was not started from a config file")
        return
    try:
        await reload_config(app[GATEWAY], path)
    except ConfigError as exc:
        log.error("reload refused, the running config stays: %s", exc)
