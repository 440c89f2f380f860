"""A zero-latency OpenAI-compatible backend: answers every completion at once, for overhead runs.

``python -m bench.harness.zero_backend --port N [--processes P]``. It reads and parses the body (as any
backend must), then replies with one short completion, streamed or whole, with usage. With
several processes (forked, sharing the port with SO_REUSEPORT, one process group) it keeps up
with a gateway that has several workers.
"""

import argparse
import asyncio
import os

import orjson
from aiohttp import web

from gateway.process import event_loop

ANSWER = "ok"


async def completion(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    chat = request.path.endswith("/chat/completions")
    prompt = body.get("prompt")
    usage = {
        "prompt_tokens": len(prompt) if isinstance(prompt, list) else 0,
        "completion_tokens": 1,
        "total_tokens": (len(prompt) if isinstance(prompt, list) else 0) + 1,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    choice = {"index": 0, "finish_reason": "stop", "logprobs": None}
    choice |= (
        {"delta" if body.get("stream") else "message": {"role": "assistant", "content": ANSWER}}
        if chat
        else {"text": ANSWER}
    )
    envelope = {"id": "cmpl-zero", "created": 0, "model": body.get("model", "zero"), "choices": [choice]}
    if not body.get("stream"):
        envelope["object"] = "chat.completion" if chat else "text_completion"
        return web.Response(body=orjson.dumps({**envelope, "usage": usage}), content_type="application/json")
    envelope["object"] = "chat.completion.chunk" if chat else "text_completion"
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    events = [envelope]
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({**envelope, "choices": [], "usage": usage})
    await response.write(b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events) + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    return web.json_response(
        {"object": "list", "data": [{"id": "smollm2-135m", "object": "model", "created": 0, "owned_by": "bench"}]}
    )


def build_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", completion)
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args(argv)
    for _ in range(args.processes - 1):
        if os.fork() == 0:
            break
    event_loop.run(serve(args.host, args.port, reuse_port=args.processes > 1))


async def serve(host: str, port: int, reuse_port: bool) -> None:
    runner = web.AppRunner(build_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_port=reuse_port).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    main()
