"""backends/upstream_client.py against real servers on loopback: keep-alive, every way an HTTP/1.1
body can end (length, chunks, close), streamed lines, back-pressure, and every way it can fail."""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from gateway.backends.upstream_client import HIGH_WATER_BYTES, UpstreamClient, UpstreamError
from tests.procs import free_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def aiohttp_server(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/x", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1/x"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def raw_server(answer: bytes, close: bool = True) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server that reads one request head and writes ``answer`` as is (then closes)."""
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer)
        await writer.drain()
        if close:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/x", received
    finally:
        server.close()


async def test_connections_are_kept_alive_and_reused() -> None:
    peers: list[object] = []

    async def echo(request: web.Request) -> web.Response:
        assert request.headers["Content-Type"] == "application/json"
        assert request.headers["Authorization"] == "Bearer k"
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return web.json_response({"echo": (await request.read()).decode()})

    client = UpstreamClient()
    async with aiohttp_server(echo) as url:
        for index in range(3):
            upstream = await client.post(url, f'"{index}"'.encode(), {"Authorization": "Bearer k"}, 1.0)
            assert (upstream.status, upstream.content_type) == (200, "application/json")
            assert await upstream.read() == b'{"echo": "\\"%d\\""}' % index
            upstream.release()
    client.close()
    assert len(peers) == 3 and len(set(peers)) == 1


async def test_a_chunked_stream_is_read_line_by_line_as_it_arrives() -> None:
    release = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await release.wait()
        await response.write(b"data: two\n\ntail")
        await response.write_eof()
        return response

    client = UpstreamClient()
    async with aiohttp_server(stream) as url:
        upstream = await client.post(url, b"{}", {}, 1.0)
        assert upstream.headers["transfer-encoding"] == "chunked"
        assert [await upstream.readline(), await upstream.readline()] == [b"data: one\n", b"\n"]
        release.set()
        lines = [await upstream.readline() for _ in range(4)]
        upstream.release()
    client.close()
    assert lines == [b"data: two\n", b"\n", b"tail", b""]


async def test_a_body_without_length_ends_when_the_server_closes_and_is_not_reused() -> None:
    async with raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it") as (url, received):
        client = UpstreamClient()
        upstream = await client.post(url, b"{}", {}, 1.0)
        assert await upstream.read() == b"all of it"
        upstream.release()
        assert not any(client._idle.values())
    assert received[0].startswith(b"POST /v1/x HTTP/1.1\r\n")


async def test_interim_answers_are_skipped() -> None:
    answer = b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(answer) as (url, _):
        upstream = await UpstreamClient().post(url, b"{}", {}, 1.0)
        assert (upstream.status, await upstream.read()) == (200, b"ok")
        assert "link" not in upstream.headers
        upstream.release()


async def test_connection_close_answers_are_not_reused() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    async with raw_server(answer, close=False) as (url, _):
        client = UpstreamClient()
        upstream = await client.post(url, b"{}", {}, 1.0)
        assert await upstream.read() == b"ok"
        upstream.release()
        assert not any(client._idle.values())
        client.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ],
    ids=["short-length", "unfinished-chunks"],
)
async def test_a_body_cut_short_raises(answer: bytes) -> None:
    async with raw_server(answer) as (url, _):
        upstream = await UpstreamClient().post(url, b"{}", {}, 1.0)
        with pytest.raises(UpstreamError, match="closed the connection"):
            await upstream.read()
        upstream.release()


@pytest.mark.parametrize("answer", [b"", b"not http at all\r\n\r\n"], ids=["closed-at-once", "garbage"])
async def test_no_answer_or_a_broken_one_raises_before_any_status(answer: bytes) -> None:
    async with raw_server(answer) as (url, _):
        with pytest.raises(UpstreamError):
            await UpstreamClient().post(url, b"{}", {}, 1.0)


async def test_a_refused_connection_raises_an_upstream_error() -> None:
    with pytest.raises(UpstreamError, match="cannot connect"):
        await UpstreamClient().post(f"http://127.0.0.1:{free_port()}/v1/x", b"{}", {}, 1.0)


async def test_a_large_body_is_read_whole_under_back_pressure() -> None:
    body = bytes(range(256)).replace(b"\n", b"") * (4 * HIGH_WATER_BYTES // 255)

    async def large(request: web.Request) -> web.Response:
        return web.Response(body=body)

    client = UpstreamClient()
    async with aiohttp_server(large) as url:
        for read in ("read", "readline"):
            upstream = await client.post(url, b"{}", {}, 1.0)
            connection = upstream._connection
            assert connection is not None
            async with asyncio.timeout(10):
                while not connection._paused:
                    await asyncio.sleep(0.01)
            assert await getattr(upstream, read)() == body, "one line, longer than the high-water mark"
            upstream.release()
    client.close()


async def test_headers_with_line_breaks_are_refused() -> None:
    with pytest.raises(UpstreamError, match="line break"):
        await UpstreamClient().post("http://127.0.0.1:9/v1/x", b"{}", {"X-Evil": "a\r\nHost: b"}, 1.0)


async def test_on_sent_runs_before_any_other_task_on_new_and_kept_alive_connections() -> None:
    events: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        events.append("served")
        return web.json_response({})

    client = UpstreamClient()
    async with aiohttp_server(answer) as url:
        for _ in range(2):
            asyncio.get_running_loop().call_soon(events.append, "other task")
            upstream = await client.post(url, b"{}", {}, 1.0, on_sent=lambda: events.append("sent"))
            await upstream.read()
            upstream.release()
    client.close()
    assert events == ["sent", "other task", "served"] * 2


async def test_an_answer_head_later_than_the_timeout_raises_timeout_and_drops_the_connection() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    gate = asyncio.Event()

    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await gate.wait()
        writer.write(answer)
        await writer.drain()

    server = await asyncio.start_server(late, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x"
    client = UpstreamClient()
    try:
        with pytest.raises(TimeoutError, match="no answer from"):  # not the outer bound's
            await asyncio.wait_for(client.post(url, b"{}", {}, 1.0, timeout_s=0.05), 30)
        assert not any(client._idle.values())
        gate.set()
        upstream = await client.post(url, b"{}", {}, 1.0, timeout_s=5.0)
        assert (upstream.status, await upstream.read()) == (200, b"ok")
        upstream.release()
    finally:
        client.close()
        server.close()
