"""A request walks the pipeline once: every stage of the path runs once per request, in order.

The real app in process in front of a fake replica; ``sys.setprofile`` records each product
function a request's path calls, counted by frame (a coroutine resumed after an ``await`` is the
same call). A stage that ran twice (a body parsed or validated again, a prompt tokenized or
hashed twice, the caps bound checked per chunk, a second routing pass) fails the test.
"""

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from tests.gateway.fake_replica import FakeReplica, chat, gateway, gateway_config, replicas

PRODUCT = ("gateway", "normalize", "radix", "protocol")
STAGES = [
    ("gateway.request_path", "parse_json_body"),
    ("gateway.request_path", "prepare_route"),
    ("gateway.openai_request", "parse_request"),
    ("protocol.openai", "validate"),
    ("gateway.admission.input_limits", "check_input"),
    ("normalize.normalizer", "Normalizer.apply"),
    ("gateway.served_model", "ServedModel.token_ids"),
    ("gateway.admission.forwarded_body", "forwarded_body"),
    ("gateway.block_hash_memo", "BlockHashMemo.block_hashes"),
    ("gateway.dispatch", "Dispatcher.dispatch"),
    ("gateway.admission.kv_blocks", "check_fits_some_replica"),
    ("gateway.admission.queue", "AdmissionQueue.admit"),
    ("gateway.routing.placement", "place"),
    ("gateway.routing.router", "Router.route"),
    ("gateway.backends.proxy", "forward"),
    ("gateway.observability.telemetry", "Telemetry.observe_completion"),
]
"""The path's stages, in the order a chat completion passes them (gateway/handler.py)."""


class Walk:
    """Every product function called while it is on, by frame, in the order first called."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], set[FrameType]] = {}
        self.order: list[tuple[str, str]] = []

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] not in PRODUCT:
            return
        key = (module, frame.f_code.co_qualname)
        frames = self.calls.setdefault(key, set())
        if not frames:
            self.order.append(key)
        frames.add(frame)

    def count(self, stage: tuple[str, str]) -> int:
        return len(self.calls.get(stage, ()))


async def walk_of(send: Callable[[Any], Any]) -> Walk:
    """The walk of the second request ``send`` makes (the first warms the tokenizer and the memo)."""
    fake = FakeReplica()
    async with replicas(fake) as urls, gateway(gateway_config(urls), None) as client:
        await send(client)
        walk = Walk()
        sys.setprofile(walk.profile)
        try:
            await send(client)
        finally:
            sys.setprofile(None)
    return walk


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_completion_passes_every_stage_once_in_order(stream: bool) -> None:
    async def send(client: Any) -> None:
        async with client.post("/v1/chat/completions", json=chat("hello there", stream=stream)) as reply:
            assert reply.status == 200
            await reply.read()

    walk = await walk_of(send)
    assert {stage: walk.count(stage) for stage in STAGES} == dict.fromkeys(STAGES, 1)
    assert sorted(STAGES, key=walk.order.index) == STAGES


async def test_the_walk_sees_a_stage_that_runs_twice() -> None:
    """The check can fail: two requests in one walk run every stage twice."""

    async def send_two(client: Any) -> None:
        for question in ("one", "two"):
            async with client.post("/v1/chat/completions", json=chat(question)) as reply:
                await reply.read()

    walk = await walk_of(send_two)
    assert walk.count(("gateway.request_path", "prepare_route")) == 2
    assert walk.count(("gateway.routing.placement", "place")) == 2
