"""Cache-aware routing in front of two engines running SmolLM2 for real (predicted mode)."""

from collections.abc import Iterator

import pytest

from tests.gateway_cluster import MODEL, gateway_config, gateway_for
from tests.procs import ManagedProcess, free_port, http

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are a terse assistant for a hardware store. Answer in one short sentence. "
    "The store sells hammers, nails, screws, drills, saws, paint, brushes and ladders, "
    "opens at eight in the morning and closes at six in the evening, every day but Sunday."
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, real_engines: list[ManagedProcess]) -> Iterator[ManagedProcess]:
    with gateway_for(
        tmp_path_factory.mktemp("routing-real"), gateway_config(free_port(), real_engines, routing={})
    ) as gateway:
        yield gateway


def test_later_turns_hit_the_replica_holding_the_conversation(gateway: ManagedProcess) -> None:
    messages = [{"role": "system", "content": SYSTEM}]
    home = None
    previous_prompt = 0
    for turn, question in enumerate(["Do you sell paint?", "When do you open?", "And on Sunday?"]):
        messages.append({"role": "user", "content": question})
        body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
        reply = http("POST", f"{gateway.url}/v1/chat/completions", body)
        assert reply.status == 200, reply.body
        completion = reply.json()
        headers = {key.lower(): value for key, value in reply.headers.items()}
        home = home or headers["x-kvgate-backend"]
        assert headers["x-kvgate-backend"] == home
        cached = completion["usage"]["prompt_tokens_details"]["cached_tokens"]
        if turn:
            assert headers["x-kvgate-route-reason"] == "prefix-hit"
            assert cached >= previous_prompt // 16 * 16
            assert int(headers["x-kvgate-predicted-cached-tokens"]) >= previous_prompt // 16 * 16
        previous_prompt = completion["usage"]["prompt_tokens"]
        messages.append({"role": "assistant", "content": completion["choices"][0]["message"]["content"]})
