"""An in-process stand-in for an external replica (vLLM, SGLang) and an in-process gateway in front of it.

The gateway under test is the real app (``create_app``) served by aiohttp's test server; only the
replica is fake, so a test can make it fail in ways a real engine rarely does on cue: a 5xx, a
connection dropped before the first byte, a stream that ends without ``[DONE]`` or breaks mid-way.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.harness.processes import free_port
from gateway.config import load_config, parse_config
from gateway.wiring.app import create_app
from gateway.wiring.state import GATEWAY, Gateway
from tests.bodies import MODEL as MODEL
from tests.bodies import chat as chat

PROMPT_TOKENS = 40
ANSWER = ["Hello", " there", "!"]
HOLD = "[hold]"
"""A streamed request whose prompt contains this waits after its first chunk until ``release`` is set."""


class Behaviour(Enum):
    ANSWER = "answer"
    FAIL_500 = "fail with 500"
    REJECT_400 = "reject with 400"
    DROP = "close the connection before answering"
    END_EARLY = "end the stream cleanly after two chunks, without [DONE]"
    BREAK = "break the connection after two chunks, once ``release`` is set"
    LINGER = "hold the stream open after [DONE] until ``release`` is set"


@dataclass
class FakeReplica:
    """Answers OpenAI completions as told by ``behaviour``; records every completion body it got."""

    behaviour: Behaviour = Behaviour.ANSWER
    cached_tokens: int = 0
    model: str = MODEL
    bodies: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/completions", self.complete)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "max_model_len": 4096}]})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.behaviour is Behaviour.DROP:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if self.behaviour is Behaviour.FAIL_500:
            return web.json_response({"error": {"message": "out of memory", "type": "server_error"}}, status=500)
        if self.behaviour is Behaviour.REJECT_400:
            return web.json_response({"error": {"message": "bad", "type": "invalid_request_error"}}, status=400)
        if not body.get("stream"):
            return web.json_response(self.whole_answer())
        return await self.stream(request, body)

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": len(ANSWER),
            "total_tokens": PROMPT_TOKENS + len(ANSWER),
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def whole_answer(self) -> dict[str, Any]:
        message = {"role": "assistant", "content": "".join(ANSWER)}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return {
            "id": "fake",
            "object": "chat.completion",
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }

    async def stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        hold = HOLD in orjson.dumps(body.get("messages") or body.get("prompt")).decode()
        for index, piece in enumerate(ANSWER):
            if index == 1 and hold:
                await self.release.wait()
            if index == 2 and self.behaviour is Behaviour.END_EARLY:
                await response.write_eof()
                return response
            if index == 2 and self.behaviour is Behaviour.BREAK:
                await self.release.wait()  # the test has read the two chunks: now break
                assert request.transport is not None
                request.transport.close()
                return response
            chunk = {
                "id": "fake",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": piece}}],
            }
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage_chunk = {"id": "fake", "object": "chat.completion.chunk", "choices": [], "usage": self.usage()}
            await response.write(b"data: " + orjson.dumps(usage_chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        if self.behaviour is Behaviour.LINGER:
            await self.release.wait()
        await response.write_eof()
        return response


@asynccontextmanager
async def replicas(*fakes: FakeReplica) -> AsyncIterator[list[str]]:
    """Several fake replicas at once; yields their URLs in order."""
    urls: list[str] = []
    servers = [TestServer(fake.app(), host="127.0.0.1") for fake in fakes]
    try:
        for server in servers:
            await server.start_server()
            urls.append(str(server.make_url("")).rstrip("/"))
        yield urls
    finally:
        for server in servers:
            await server.close()


def gateway_config(urls: list[str], **sections: Any) -> dict[str, Any]:
    """Backends a, b, c... at ``urls``; approximate tokenization (no model files needed), round robin."""
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "model": MODEL,
        "tokenizer": "approximate",
        "backends": [{"name": chr(ord("a") + index), "url": url} for index, url in enumerate(urls)],
        "routing": {"policy": "round_robin"},
    }
    config.update(sections)
    return config


@asynccontextmanager
async def gateway(config: dict[str, Any], config_file: Path | None) -> AsyncIterator[TestClient]:
    """The real gateway app in process, its handlers cancelled when a client leaves as ``kvgate gateway``
    runs them; with ``config_file`` it is started from (and reloads) that file."""
    if config_file is not None:
        config_file.write_text(yaml.safe_dump(config))
        app = create_app(load_config(config_file), config_file)
    else:
        app = create_app(parse_config(config, "test"))
    async with TestClient(TestServer(app, host="127.0.0.1", handler_cancellation=True)) as client:
        yield client


def state(client: TestClient) -> Gateway:
    """The running gateway's composition root (in-process tests may look inside)."""
    return client.app[GATEWAY]


async def sse_payloads(reply: aiohttp.ClientResponse) -> list[Any]:
    """Every SSE data payload of a streamed reply: parsed JSON, or b"[DONE]"."""
    payloads: list[Any] = []
    async for line in reply.content:
        if line.startswith(b"data: "):
            payload = line[6:].strip()
            payloads.append(payload if payload == b"[DONE]" else orjson.loads(payload))
    return payloads
