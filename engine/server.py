"""The engine's OpenAI-compatible HTTP API (aiohttp).

Handlers validate and tokenize, then stream from ``LLMEngine.generate``. With
``handler_cancellation`` on, a client that disconnects cancels its handler, which closes the
output stream and so aborts the request in the engine.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from engine.llm_engine import EngineError, LLMEngine, RequestOutput
from engine.load_publisher import LoadPublisher
from engine.openai_responses import ResponseShape
from engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ProtocolError,
    chat_prompt_ids,
    check_model,
    completion_prompt_ids,
    error_body,
    parse_request,
    sampling_params,
)
from normalize.chat_tokenizer import ChatTokenizer
from protocol.replica_stats import encode_stats

log = logging.getLogger(__name__)

_MAX_BODY_BYTES = 32 * 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as an OpenAI error object, never as HTML or a stack trace."""
    try:
        return await handler(request)
    except ProtocolError as exc:
        return json_response(exc.body, exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error_type = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return json_response(error_body(f"{request.method} {request.path}: {exc.reason}", error_type), exc.status)
    except EngineError as exc:
        return json_response(error_body(str(exc), "internal_error"), 500)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_response(error_body("internal server error", "internal_error"), 500)


class EngineServer:
    def __init__(
        self,
        engine: LLMEngine,
        tokenizer: ChatTokenizer,
        served_model_name: str,
        max_model_len: int,
        load_publisher: LoadPublisher | None = None,
    ) -> None:
        self.engine = engine
        self.load_publisher = load_publisher
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.created = int(time.time())

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[openai_errors], client_max_size=_MAX_BODY_BYTES)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.on_startup.append(self._start_engine)
        app.on_cleanup.append(self._stop_engine)
        return app

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_request(await request.read(), CompletionRequest)
        check_model(body, self.served_model_name)
        prompt_ids = await asyncio.to_thread(completion_prompt_ids, body, self.tokenizer)
        return await self._generate(request, body, prompt_ids, ResponseShape(self.served_model_name, chat=False))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_request(await request.read(), ChatCompletionRequest)
        check_model(body, self.served_model_name)
        prompt_ids = await asyncio.to_thread(chat_prompt_ids, body, self.tokenizer)
        return await self._generate(request, body, prompt_ids, ResponseShape(self.served_model_name, chat=True))

    async def models(self, request: web.Request) -> web.Response:
        model = {
            "id": self.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "kvgate",
            "max_model_len": self.max_model_len,
        }
        return json_response({"object": "list", "data": [model]})

    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.engine.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stats(self, request: web.Request) -> web.Response:
        return web.Response(body=encode_stats(self.engine.stats()), content_type="application/json")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.reset_prefix_cache()
        return json_response({"status": "ok"})

    async def _generate(
        self,
        request: web.Request,
        body: CompletionRequest | ChatCompletionRequest,
        prompt_ids: list[int],
        shape: ResponseShape,
    ) -> web.StreamResponse:
        params = sampling_params(body, len(prompt_ids), self.max_model_len)
        outputs = self.engine.generate(
            prompt_ids,
            params,
            self.max_model_len,
            self.tokenizer.eos_token_id,
            body.cache_salt,
            body.kvgate_session,
        )
        async with aclosing(outputs):
            if body.stream:
                return await self._stream(request, outputs, shape, body.include_usage)
            text: list[str] = []
            final: RequestOutput | None = None
            async for output in outputs:
                text.append(output.text)
                final = output
            assert final is not None
            return json_response(shape.whole("".join(text), final))

    async def _stream(
        self, request: web.Request, outputs: AsyncIterator[RequestOutput], shape: ResponseShape, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        first = True
        try:
            async for output in outputs:
                if output.text or output.finished:
                    await _send_event(response, shape.chunk(output.text, output.finish_reason, first))
                    first = False
                if output.finished and include_usage:
                    await _send_event(response, shape.usage_chunk(output))
        except EngineError as exc:
            await _send_event(response, error_body(str(exc), "internal_error"))
        except ConnectionResetError:
            log.debug("client of %s went away mid-stream", shape.request_id)
            return response
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _start_engine(self, app: web.Application) -> None:
        self.engine.start(asyncio.get_running_loop())
        if self.load_publisher is not None:
            self.load_publisher.start()

    async def _stop_engine(self, app: web.Application) -> None:
        if self.load_publisher is not None:
            await asyncio.to_thread(self.load_publisher.stop)
        await asyncio.to_thread(self.engine.stop)


async def _send_event(response: web.StreamResponse, data: dict[str, Any]) -> None:
    await response.write(b"data: " + orjson.dumps(data) + b"\n\n")
