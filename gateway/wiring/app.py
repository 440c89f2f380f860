"""The gateway's aiohttp application: routes, error shaping, start-up and shutdown."""

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway import handler as endpoints
from gateway import model_endpoints, tokenize_endpoints
from gateway.admin.app import admin_app
from gateway.anthropic import endpoints as anthropic
from gateway.anthropic.errors import anthropic_error_response
from gateway.config import KvgateConfig
from gateway.errors import OpenAIError, error_response
from gateway.gateway_request import GatewayRequest
from gateway.observability.loop_lag import LoopLagMonitor
from gateway.observability.routes import add_routes as add_observability_routes
from gateway.wiring.reload import CONFIG_PATH
from gateway.wiring.state import GATEWAY, Gateway
from protocol.tracing import configure_tracing, otlp_exporter

log = logging.getLogger("kvgate.gateway")

MAX_BODY_BYTES = 8 << 20
ANTHROPIC_PATHS = "/v1/messages"
"""Paths whose errors are Anthropic-shaped, whatever raised them."""


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error a client sees is OpenAI-shaped, including aiohttp's own (404, 405, 413), which
    are recorded as refusals (the endpoints record their own)."""
    render = anthropic_error_response if request.path.startswith(ANTHROPIC_PATHS) else error_response
    request_id = {"x-request-id": endpoints.client_request_id(request)}
    try:
        return await handler(request)
    except OpenAIError as error:
        return render(error, request_id)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
        message = exc.reason or exc.text or "error"
        if exc.status in (404, 405):
            message = f"{message}: {request.method} {request.path}"
        refusal = OpenAIError(exc.status, message, code=code)
        _record_refusal(request.config_dict.get(GATEWAY), refusal)
        return render(refusal, request_id)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        failure = OpenAIError(500, "internal gateway error", type_="server_error", code="internal_error")
        return render(failure, request_id)


def refusal_recorder(app: web.Application) -> Callable[[OpenAIError], None]:
    """What records a request refused before any endpoint ran (aiohttp's parser) for ``app``."""
    return lambda error: _record_refusal(app.get(GATEWAY), error)


def _record_refusal(gateway: Gateway | None, error: OpenAIError) -> None:
    """Record a request refused before any endpoint ran (aiohttp's parser or router) in the request
    log and metrics, like every other refusal; ``gateway`` is None before it has started."""
    if gateway is not None:
        gateway.telemetry.observe_rejection(GatewayRequest(f"req-{uuid.uuid4().hex}"), error)


def create_app(config: KvgateConfig, config_path: Path | None = None) -> web.Application:
    """The app; ``config_path`` is the file that `POST /admin/reload` and SIGHUP re-read."""
    app = web.Application(middlewares=[openai_errors], client_max_size=MAX_BODY_BYTES)
    if config_path is not None:
        app[CONFIG_PATH] = config_path
    app.router.add_post("/v1/chat/completions", endpoints.chat_completions)
    app.router.add_post("/v1/completions", endpoints.completions)
    app.router.add_post("/v1/responses", endpoints.responses)
    app.router.add_post("/v1/embeddings", endpoints.embeddings)
    app.router.add_post("/v1/messages", anthropic.messages)
    app.router.add_post("/v1/messages/count_tokens", anthropic.count_tokens)
    app.router.add_get("/v1/models", endpoints.list_models)
    app.router.add_get("/v1/models/{model_id}", model_endpoints.retrieve_model)
    app.router.add_post("/tokenize", tokenize_endpoints.tokenize)
    app.router.add_post("/detokenize", tokenize_endpoints.detokenize)
    app.router.add_get("/tokenizer_info", tokenize_endpoints.tokenizer_info_endpoint)
    app.router.add_get("/health", endpoints.health)
    app.add_subapp("/admin", admin_app())
    add_observability_routes(app)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        if config.observability.otlp_traces_endpoint:
            configure_tracing("kvgate-gateway", otlp_exporter(config.observability.otlp_traces_endpoint))
        gateway = Gateway.build(config)
        app[GATEWAY] = gateway
        await gateway.start()
        metrics = gateway.telemetry.metrics
        lag_monitor = LoopLagMonitor(
            metrics.loop_lag, metrics.loop_lag_max, stall_s=config.observability.loop_stall_log_s
        )
        lag_monitor.start()
        yield
        await lag_monitor.stop()
        await gateway.stop()

    app.cleanup_ctx.append(lifecycle)
    return app
