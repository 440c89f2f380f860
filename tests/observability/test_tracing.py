"""OpenTelemetry spans of one streamed request, gateway and engine in this process, one trace.

The gateway and a simulated engine run as aiohttp test servers on loopback in the test's
process, so the SDK's in-memory exporter sees the spans of both; they talk over HTTP exactly
as separate processes do (W3C ``traceparent`` in the request headers).
"""

import asyncio
import secrets
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine.cli import build_parser, build_server, config_from_args
from gateway.config import parse_config
from gateway.wiring.app import create_app
from protocol.tracing import configure_tracing

GATEWAY_SPANS = {
    "kvgate.request",
    "gateway.auth",
    "gateway.normalize",
    "gateway.tokenize",
    "gateway.queue",
    "gateway.route",
    "gateway.upstream",
    "gateway.stream",
}
ENGINE_SPANS = {"engine.request", "engine.queue", "engine.prefill", "engine.decode"}


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    configure_tracing("kvgate-test", exporter, batch=False)
    return exporter


@pytest.fixture
async def gateway_url(exporter: InMemorySpanExporter) -> AsyncIterator[str]:
    flags = ["--sim", "--sim-preset", "instant", "--num-blocks", "128", "--max-model-len", "1024"]
    engine = TestServer(build_server(config_from_args(build_parser().parse_args(flags))).build_app())
    await engine.start_server()
    config = parse_config(
        {"model": "smollm2-135m", "backends": [{"name": "e0", "url": str(engine.make_url("")).rstrip("/")}]}, "test"
    )
    gateway = TestServer(create_app(config))
    await gateway.start_server()
    yield str(gateway.make_url("")).rstrip("/")
    await gateway.close()
    await engine.close()


async def spans_of(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    """The trace's spans once the gateway's root span has ended (it ends after the stream does)."""
    deadline = time.monotonic() + 10
    while True:
        spans = [span for span in exporter.get_finished_spans() if span.context.trace_id == trace_id]
        if any(span.name == "kvgate.request" for span in spans):
            return spans
        assert time.monotonic() < deadline, "the gateway's request span never ended"
        await asyncio.sleep(0.01)


async def test_a_streamed_request_leaves_gateway_and_engine_spans_in_the_callers_trace(
    gateway_url: str, exporter: InMemorySpanExporter
) -> None:
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    body = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway_url}/v1/chat/completions", json=body, headers={"traceparent": f"00-{trace_id}-{caller_span}-01"}
        ) as reply,
    ):
        assert reply.status == 200 and (await reply.read()).rstrip().endswith(b"data: [DONE]")
    spans = await spans_of(exporter, int(trace_id, 16))
    by_name = {span.name: span for span in spans}
    assert set(by_name) == GATEWAY_SPANS | ENGINE_SPANS
    assert by_name["kvgate.request"].parent.span_id == int(caller_span, 16)
    assert by_name["engine.request"].parent.span_id == by_name["gateway.upstream"].context.span_id
    for phase in ("engine.queue", "engine.prefill", "engine.decode"):
        assert by_name[phase].parent.span_id == by_name["engine.request"].context.span_id
        assert by_name[phase].start_time <= by_name[phase].end_time
    assert by_name["engine.prefill"].end_time <= by_name["engine.decode"].end_time
    assert by_name["gateway.stream"].parent.span_id == by_name["gateway.upstream"].context.span_id
