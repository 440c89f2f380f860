"""A third-party backend that serves Anthropic's ``POST /v1/messages`` itself, as vLLM >= 0.10 and
SGLang do, answering in Anthropic's JSON and SSE shapes with usage. It is a stand-in for someone
else's server (run as its own process: ``python -m tests.gateway.anthropic_messages_backend --port N``),
not for any kvgate component, and it serves nothing else a generating replica would: chat
completions get a 404, so a request the gateway translated instead of passing through fails.

A prompt containing ``[long]`` is answered with ``LONG_DELTAS`` text deltas whatever its
``max_tokens`` (a backend ignoring the cap); one containing ``[refuse]`` gets Anthropic's 400.
``GET /received`` lists the bodies it got.
"""

import argparse
import json
from typing import Any

from aiohttp import web

MODEL = "smollm2-135m"
ANSWER = ["Native", " answer", " from", " the", " Messages", " backend."]
LONG_DELTAS = 200
INPUT_TOKENS = 30
CACHE_READ_TOKENS = 12
CACHE_CREATION_TOKENS = 4

_RECEIVED = web.AppKey("received", list)


def _prompt_text(body: dict[str, Any]) -> str:
    texts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        texts.extend(block.get("text", "") for block in blocks if isinstance(block, dict))
    return " ".join(texts)


def _usage(output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": INPUT_TOKENS,
        "cache_read_input_tokens": CACHE_READ_TOKENS,
        "cache_creation_input_tokens": CACHE_CREATION_TOKENS,
        "output_tokens": output_tokens,
    }


def _deltas(body: dict[str, Any]) -> tuple[list[str], str]:
    """The text deltas to send and the stop reason."""
    if "[long]" in _prompt_text(body):
        return ["x"] * LONG_DELTAS, "end_turn"
    limit = int(body.get("max_tokens") or 0)
    return ANSWER[:limit], "max_tokens" if limit < len(ANSWER) else "end_turn"


async def messages(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[_RECEIVED].append(body)
    if "[refuse]" in _prompt_text(body):
        error = {"type": "invalid_request_error", "message": "the native backend refuses this prompt"}
        return web.json_response({"type": "error", "error": error}, status=400)
    deltas, stop_reason = _deltas(body)
    message = {"id": "msg_native_1", "type": "message", "role": "assistant", "model": body.get("model")}
    if not body.get("stream"):
        content = [{"type": "text", "text": "".join(deltas)}]
        whole = {**message, "content": content, "stop_reason": stop_reason, "stop_sequence": None}
        return web.json_response({**whole, "usage": _usage(len(deltas))})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(1)}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}} for d in deltas),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": _usage(len(deltas)),
        },
        {"type": "message_stop"},
    ]
    for event in events:
        await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    await response.write_eof()
    return response


async def received(request: web.Request) -> web.Response:
    return web.json_response(request.app[_RECEIVED])


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "max_model_len": 4096}]})


def app() -> web.Application:
    application = web.Application()
    application[_RECEIVED] = []
    application.router.add_get("/health", health)
    application.router.add_get("/v1/models", models)
    application.router.add_get("/received", received)
    application.router.add_post("/v1/messages", messages)
    return application


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    web.run_app(app(), host="127.0.0.1", port=parser.parse_args().port, print=None)
