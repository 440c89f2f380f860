"""Config hot reload: SIGHUP or `POST /admin/reload` re-reads the config file and applies it live.

The new file is validated whole before anything changes; a broken one is refused with its
error and the running config stays. What applying it changes is `Gateway.apply`'s job. In-flight
and queued requests are never dropped.
"""

import asyncio
import logging
from pathlib import Path

import orjson
from aiohttp import web

from gateway.config import ConfigError, KvgateConfig, load_config
from gateway.errors import OpenAIError
from gateway.state import GATEWAY, Gateway

log = logging.getLogger("kvgate.reload")

CONFIG_PATH = web.AppKey("config_path", Path)

_one_at_a_time = asyncio.Lock()
_signal_reloads: set[asyncio.Task] = set()


async def reload_config(gateway: Gateway, path: Path) -> KvgateConfig:
    """Load ``path`` and apply it to the running gateway; ConfigError leaves everything as it was."""
    async with _one_at_a_time:
        config = load_config(path)
        await gateway.apply(config, str(path))
    log.info("config %s reloaded: %d backends, %d tenants", path, len(config.backends), len(config.tenants))
    return config


async def reload_endpoint(request: web.Request) -> web.Response:
    """`POST /admin/reload`: 200 with the backends now configured, or 400 with the config's error."""
    gateway = request.config_dict[GATEWAY]
    path = request.config_dict.get(CONFIG_PATH)
    if path is None:
        raise OpenAIError(409, "This gateway was not started from a config file.", code="no_config_file")
    try:
        config = await reload_config(gateway, path)
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
