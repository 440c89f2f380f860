"""First-token and idle-stream timeouts against a simulated engine that takes 4 s per step."""

import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.gateway_cluster import (
    INSTANT_SIM,
    MODEL,
    chat,
    gateway_config,
    gateway_for,
    gateway_with_engines,
    post,
    running,
    start_engines,
    stream,
)
from tests.procs import ManagedProcess, free_port

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    stalled = (*INSTANT_SIM, "--sim-step-overhead-s", "4")
    with gateway_with_engines(
        tmp_path_factory.mktemp("timeouts"),
        [stalled, INSTANT_SIM],
        routing={"policy": "round_robin"},
        timeouts={"first_token_s": TIMEOUT_S, "idle_stream_s": TIMEOUT_S},
        health={"interval_s": 0.5, "eject_after_failures": 1000},
    ) as gateway:
        yield gateway


def completion(stream_: bool = False) -> dict:
    return {"model": MODEL, "prompt": "Count to three.", "max_tokens": 4, "stream": stream_}


async def test_stalled_stream_ends_with_an_error_event_after_the_idle_timeout(tmp_path: Path) -> None:
    """The first token comes at once (instant prefill), then the replica goes quiet (4 s per decode step)."""
    slow_decode = ("--sim", "--sim-preset", "instant", "--sim-decode-base-s", "4")
    with running(start_engines(tmp_path, 1, *slow_decode)) as engines:
        timeouts = {"first_token_s": TIMEOUT_S, "idle_stream_s": TIMEOUT_S}
        with gateway_for(tmp_path, gateway_config(free_port(), engines, timeouts=timeouts)) as gateway:
            async with aiohttp.ClientSession() as session:
                started = time.perf_counter()
                status, events = await stream(session, f"{gateway.url}/v1/chat/completions", chat("stream", 4))
                seconds = time.perf_counter() - started
    assert status == 200 and events[0]["choices"][0]["delta"]["content"], events
    last = events[-1]
    assert last["error"]["type"] == "upstream_error" and "TimeoutError" in last["error"]["message"]
    assert seconds >= TIMEOUT_S, "it waited the idle timeout; the stalled engine would have taken 12 s"


@pytest.mark.parametrize("streaming", [False, True])
async def test_no_first_token_in_time_is_a_504_not_retried_elsewhere(gateway: ManagedProcess, streaming: bool) -> None:
    """Round robin sends one of two requests to the stalled replica: that one gets 504 after the
    first-token timeout instead of a second try (gateway/dispatch.py says why); the other is served."""
    url = f"{gateway.url}/v1/completions"
    outcomes = []
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            if streaming:
                status, events = await stream(session, url, completion(True))
                outcomes.append((status, events[-1] == b"[DONE]" if status == 200 else events[0]["error"]["code"]))
            else:
                status, headers, body = await post(session, url, completion())
                outcomes.append(
                    (status, headers.get("x-kvgate-route-reason") if status == 200 else body["error"]["code"])
                )
    assert sorted(outcomes, key=lambda outcome: outcome[0]) == [
        (200, True if streaming else "round-robin"),
        (504, "upstream_timeout"),
    ]
