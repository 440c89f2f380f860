"""The gateway's first token is the first chunk that carries output, whatever a backend sends
before it: here a backend that sends the role chunk at once and its first token only when the test
lets it (as the bundled engine did before its prefill, and as other engines still may)."""

import asyncio
import contextlib
import json
import time
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from tests.gateway_cluster import MODEL, gateway_for, get_json
from tests.procs import free_port


class RoleFirstBackend:
    """An OpenAI-compatible stub of a third-party engine: role chunk now, content on ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await send(response, {"role": "assistant", "content": ""}, None)
        await self.release.wait()
        await send(response, {"content": "Hello"}, None)
        await send(response, {"content": "!"}, "stop")
        usage = {"prompt_tokens": 300, "completion_tokens": 2, "total_tokens": 302}
        await response.write(b"data: " + orjson.dumps({"id": "x", "choices": [], "usage": usage}) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response


async def send(response: web.StreamResponse, delta: dict, finish_reason: str | None) -> None:
    chunk = {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")


async def until_role_chunk(reply: aiohttp.ClientResponse) -> None:
    async for line in reply.content:
        if line.startswith(b"data: {"):
            assert orjson.loads(line[6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            return


def test_ttft_and_prefill_load_wait_for_the_first_output(tmp_path: Path) -> None:
    asyncio.run(scenario(tmp_path))


async def scenario(tmp_path: Path) -> None:
    backend = RoleFirstBackend()
    runner = web.AppRunner(backend.app())
    await runner.setup()
    backend_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", backend_port).start()
    port = free_port()
    log_path = tmp_path / "requests.jsonl"
    config = {
        "listen": {"port": port},
        "model": MODEL,
        "backends": [{"name": "b0", "url": f"http://127.0.0.1:{backend_port}"}],
        "health": {"interval_s": 0.5},
        "observability": {"request_log_path": str(log_path)},
    }
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 300}], "max_tokens": 4, "stream": True}
    with contextlib.ExitStack() as stack:
        gateway = await asyncio.to_thread(stack.enter_context, gateway_for(tmp_path, config))
        try:
            async with aiohttp.ClientSession() as session:
                await until_healthy(session, gateway.url)
                sent = time.monotonic()
                async with session.post(f"{gateway.url}/v1/chat/completions", json=body) as reply:
                    await until_role_chunk(reply)
                    stats = await get_json(session, f"{gateway.url}/dashboard/stats.json")
                    replica = stats["replicas"][0]
                    assert replica["in_flight"] == 1
                    assert replica["in_flight_prefill_tokens"] > 200, "prefill load released at the role chunk"
                    await asyncio.sleep(0.2)
                    held_s = time.monotonic() - sent
                    backend.release.set()
                    await reply.read()
            record = await wait_for_log(log_path)
            # The request reached the gateway after ``sent``, by a delay a busy machine stretches: half of held_s.
            assert record["ttft_s"] >= held_s / 2, f"TTFT {record['ttft_s']} counted the role chunk"
        finally:
            await runner.cleanup()


async def until_healthy(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(200):
        stats = await get_json(session, f"{url}/dashboard/stats.json")
        if stats["replicas"] and stats["replicas"][0]["healthy"]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the backend never turned healthy")


async def wait_for_log(path: Path) -> dict:
    for _ in range(200):
        if path.exists() and path.read_text().strip():
            return json.loads(path.read_text().strip().splitlines()[-1])
        await asyncio.sleep(0.05)
    raise AssertionError("no request log line")
