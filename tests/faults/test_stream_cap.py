"""A backend that ignores max_tokens cannot stream past the cap the gateway granted (issue 18.1).

The backend here stands for a third-party engine that misbehaves; it is a small aiohttp server
in the test process. The gateway is the real one, in its own process.
"""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.gateway_cluster import MODEL, chat, gateway_config, gateway_for, get_json, stream
from tests.procs import free_port

CAP = 8
CHUNKS = 1000


@dataclass
class RunawayBackend:
    """Answers every completion with CHUNKS text chunks, whatever max_tokens it was given."""

    url: str = ""
    sent: list[int] = field(default_factory=list)
    """Chunks written per request before the gateway hung up (CHUNKS when it never did)."""

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat_shape = request.path.endswith("/chat/completions")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        written = 0
        try:
            for index in range(CHUNKS):
                choice = {"index": 0, "delta": {"content": f" w{index}"}} if chat_shape else {"index": 0, "text": "w"}
                chunk = {"id": "x", "object": "chat.completion.chunk" if chat_shape else "text_completion"}
                await response.write(b"data: " + orjson.dumps({**chunk, "model": body["model"], "choices": [choice]}))
                await response.write(b"\n\n")
                written += 1
                await asyncio.sleep(0.002)
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        finally:
            self.sent.append(written)
        return response

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """A Responses stream of CHUNKS text deltas, whatever max_output_tokens it was given."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        written = 0
        try:
            await response.write(_responses_event({"type": "response.created", "response": {"id": "resp_x"}}))
            for index in range(CHUNKS):
                await response.write(_responses_event({"type": "response.output_text.delta", "delta": f" w{index}"}))
                written += 1
                await asyncio.sleep(0.002)
            usage = {"input_tokens": 5, "output_tokens": CHUNKS, "total_tokens": CHUNKS + 5}
            await response.write(_responses_event({"type": "response.completed", "response": {"usage": usage}}))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        finally:
            self.sent.append(written)
        return response


def _responses_event(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


@pytest.fixture
async def runaway() -> AsyncIterator[RunawayBackend]:
    backend = RunawayBackend()
    app = web.Application()
    app.router.add_get("/health", backend.health)
    app.router.add_post("/v1/chat/completions", backend.completions)
    app.router.add_post("/v1/completions", backend.completions)
    app.router.add_post("/v1/responses", backend.responses)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    backend.url = f"http://127.0.0.1:{port}"
    yield backend
    await runner.cleanup()


async def wait_closed(backend: RunawayBackend, requests: int) -> None:
    """Wait, with the gateway still up, until the backend recorded `requests` ended streams.

    The backend's handler learns of the hang-up at its next write, after the client's answer
    is already in hand. A full runaway stream lasts over CHUNKS * 2 ms, so a gateway that never
    closed the upstream records CHUNKS here and fails the caller's check.
    """
    for _ in range(400):
        if len(backend.sent) >= requests:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"the backend ended {len(backend.sent)} of {requests} streams")


async def wait_healthy(session: aiohttp.ClientSession, gateway_url: str) -> None:
    for _ in range(400):
        if (await get_json(session, f"{gateway_url}/health"))["healthy_backends"]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the backend never turned healthy")


async def test_a_stream_past_the_granted_cap_is_ended_by_the_gateway(tmp_path: Path, runaway: RunawayBackend) -> None:
    config = gateway_config(free_port(), [], limits={"max_tokens": CAP, "max_tokens_policy": "clamp"})
    config["backends"] = [{"name": "runaway", "url": runaway.url}]
    running = gateway_for(tmp_path, config)
    gateway = await asyncio.to_thread(running.__enter__)
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, gateway.url)
            body = {**chat("Tell me everything.", 500), "stream_options": {"include_usage": True}}
            status, events = await stream(session, f"{gateway.url}/v1/chat/completions", body)
            assert status == 200 and events[-1] == b"[DONE]"
            chunks = [event for event in events[:-1] if event["choices"]]
            assert [bool(chunk["choices"][0]["delta"].get("content")) for chunk in chunks] == [True] * CAP + [False]
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            assert events[-2]["usage"]["completion_tokens"] == CAP
            prompt = {"model": MODEL, "prompt": "Story:", "max_completion_tokens": 1}
            status, events = await stream(session, f"{gateway.url}/v1/completions", prompt)
            assert status == 200 and sum(bool(event["choices"][0]["text"]) for event in events[:-1]) == 1
        await wait_closed(runaway, 2)
    finally:
        await asyncio.to_thread(running.__exit__, None, None, None)
    assert len(runaway.sent) == 2 and max(runaway.sent) < CHUNKS, "the gateway closed the runaway upstream"


async def test_a_responses_stream_past_the_granted_cap_is_ended_by_the_gateway(
    tmp_path: Path, runaway: RunawayBackend
) -> None:
    config = gateway_config(free_port(), [], limits={"max_tokens": CAP, "max_tokens_policy": "clamp"})
    config["backends"] = [{"name": "runaway", "url": runaway.url}]
    running = gateway_for(tmp_path, config)
    gateway = await asyncio.to_thread(running.__enter__)
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, gateway.url)
            body = {"model": MODEL, "input": "Tell me everything.", "max_output_tokens": 500, "stream": True}
            async with session.post(f"{gateway.url}/v1/responses", json=body) as response:
                assert response.status == 200
                raw = await response.read()
        await wait_closed(runaway, 1)
    finally:
        await asyncio.to_thread(running.__exit__, None, None, None)
    events = [orjson.loads(line[len(b"data: ") :]) for line in raw.splitlines() if line.startswith(b"data: ")]
    deltas = [event for event in events if event["type"] == "response.output_text.delta"]
    assert len(deltas) == CAP
    closing = events[-1]
    assert closing["type"] == "response.incomplete"
    assert closing["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert closing["response"]["usage"]["output_tokens"] == CAP
    assert len(runaway.sent) == 1 and runaway.sent[0] < CHUNKS, "the gateway closed the runaway upstream"
