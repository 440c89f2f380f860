"""Config hot reload: SIGHUP or `POST /admin/reload` re-reads the config file and applies it live.

The new file is validated whole before anything changes; a broken one is refused with its
error and the running config stays. Applying it adds new backends, drains removed ones (they
finish what they have, take nothing new), and swaps policies, limits, tenants and timeouts for
the requests that arrive next. In-flight and queued requests are never dropped; tenants keep
their in-flight counts and token budgets across the swap.
"""

import asyncio
import logging
from pathlib import Path

import orjson
from aiohttp import web

from gateway.admission.auth import require_admin
from gateway.admission.caps import RequestCaps
from gateway.admission.tenants import TenantRegistry
from gateway.config import ConfigError, KvgateConfig, load_config
from gateway.errors import OpenAIError
from gateway.served_model import ModelRegistry
from gateway.state import GATEWAY, Gateway, backend_specs, replica_specs

log = logging.getLogger("kvgate.reload")

CONFIG_PATH = web.AppKey("config_path", Path)

_one_at_a_time = asyncio.Lock()
_signal_reloads: set[asyncio.Task] = set()


async def reload_config(gateway: Gateway, path: Path) -> KvgateConfig:
    """Load ``path`` and apply it to the running gateway; ConfigError leaves everything as it was."""
    async with _one_at_a_time:
        return await _reload(gateway, path)


async def _reload(gateway: Gateway, path: Path) -> KvgateConfig:
    config = load_config(path)
    if config.block_size != gateway.config.block_size:
        raise ConfigError(f"invalid config {path}: block_size cannot change without a restart")
    if config.listen != gateway.config.listen:
        log.warning("listen changes in %s take effect at the next restart", path)
        config.listen = gateway.config.listen
    try:
        tenants = TenantRegistry(config.tenants, gateway.tenants)
    except ValueError as exc:
        raise ConfigError(f"invalid config {path}: {exc}") from None
    models = gateway.models
    if _model_sources(config) != _model_sources(gateway.config):
        models = await asyncio.to_thread(ModelRegistry.from_config, config)
    try:
        gateway.router.update(config.routing, replica_specs(config, gateway.pool))
    except ValueError as exc:
        raise ConfigError(f"invalid config {path}: routing: {exc}") from None
    gateway.config = config
    gateway.models = models
    gateway.tenants = tenants
    gateway.limits = RequestCaps(config.limits, gateway.pool.context_length)
    gateway.dispatcher.configure(config.timeouts, config.limits)
    await gateway.pool.update(backend_specs(config), config.health, gateway.session)
    log.info("config %s reloaded: %d backends, %d tenants", path, len(config.backends), len(config.tenants))
    return config


async def reload_endpoint(request: web.Request) -> web.Response:
    """`POST /admin/reload`: 200 with the backends now configured, or 400 with the config's error."""
    require_admin(request)
    gateway = request.app[GATEWAY]
    path = request.app.get(CONFIG_PATH)
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


def _model_sources(config: KvgateConfig) -> tuple:
    """What the model registry is built from."""
    backends = tuple((backend.model, backend.tokenizer) for backend in config.backends)
    return config.model, config.tokenizer, config.normalize, backends
