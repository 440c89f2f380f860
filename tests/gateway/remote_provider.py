"""A stand-in for a hosted OpenAI-compatible provider (not a kvgate part), run as its own process.

It demands ``Authorization: Bearer $REMOTE_PROVIDER_KEY`` on /v1/* and, like OpenAI, echoes a
wrong key in its 401 message; lists one model and one LoRA adapter (with ``parent``) in
/v1/models; and answers chat completions, whole or streamed, with a JSON text that reports the
`model`, `traceparent` and `x-extra` header it received, so tests can see what the gateway sent.

    python -m tests.gateway.remote_provider PORT
"""

import os
import sys

import orjson
from aiohttp import web

MODEL = "remote-model"
ADAPTER = "sql-lora"


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


@web.middleware
async def require_key(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
    if request.path.startswith("/v1/"):
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if given != os.environ["REMOTE_PROVIDER_KEY"]:
            message = f"Incorrect API key provided: {given}. You can find your API key at your provider."
            error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
            return _json({"error": error}, 401)
    return await handler(request)


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    data = [
        {"id": MODEL, "object": "model", "parent": None, "max_model_len": 4096},
        {"id": ADAPTER, "object": "model", "parent": MODEL},
    ]
    return _json({"object": "list", "data": data})


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    seen = {
        "model": body["model"],
        "traceparent": request.headers.get("traceparent"),
        "x_extra": request.headers.get("x-extra"),
    }
    text = orjson.dumps(seen).decode()
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    envelope = {"id": "chatcmpl-standin", "created": 0, "model": body["model"]}
    if not body.get("stream"):
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        return _json({**envelope, "object": "chat.completion", "choices": [choice], "usage": usage})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    delta = {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    for chunk in ({"choices": [delta], "usage": None}, {"choices": [], "usage": usage}):
        event = {**envelope, "object": "chat.completion.chunk", **chunk}
        await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def main() -> None:
    app = web.Application(middlewares=[require_key])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)


if __name__ == "__main__":
    main()
