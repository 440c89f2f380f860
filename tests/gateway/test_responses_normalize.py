"""A Responses request is normalized like a chat request before it is hashed and forwarded: two
spellings of the same instructions (or developer input item) that differ only in whitespace
and line endings share their prefix blocks."""

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.gateway.fake_replica import MODEL, gateway, gateway_config, replicas, sse_payloads
from tests.gateway.test_responses_proxy import ResponsesReplica

LINES = [
    f"Rule {number}: answer the customers of the cafe politely, briefly and in their language." for number in range(30)
]
CANONICAL = "\n".join(LINES)
NOISY = "\r\n".join(line + "  " for line in LINES) + " \r\n"


def with_instructions(text: str) -> dict[str, Any]:
    return {"model": MODEL, "instructions": text, "input": "Can I book for four?", "stream": True}


def with_developer_item(text: str) -> dict[str, Any]:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}]},
        {"type": "message", "role": "user", "content": "Can I book for four?"},
    ]
    return {"model": MODEL, "input": items, "stream": True}


@pytest.mark.parametrize("make_body", [with_instructions, with_developer_item], ids=["instructions", "input-item"])
async def test_a_noisy_spelling_hits_the_prefix_the_canonical_one_left(tmp_path: Path, make_body: Any) -> None:
    replica = ResponsesReplica()
    replica.release.set()
    log = tmp_path / "requests.log"
    async with replicas(replica) as urls:
        config = gateway_config(urls, routing={"policy": "cache_aware"}, observability={"request_log_path": str(log)})
        async with gateway(config, None) as client:
            headers = []
            for text in (CANONICAL, NOISY):
                async with client.post("/v1/responses", json=make_body(text)) as reply:
                    assert reply.status == 200
                    await sse_payloads(reply)
                    headers.append(reply.headers)
    first, second = (orjson.loads(line) for line in log.read_text().splitlines()[-2:])
    assert second["prompt_tokens"] == first["prompt_tokens"] > 160
    assert second["predicted_cached_tokens"] >= (first["prompt_tokens"] // 16 - 1) * 16
    assert {"line_endings", "trailing_whitespace", "strip_message"} <= set(headers[1]["x-kvgate-normalized"].split(","))
    assert "x-kvgate-normalized" not in headers[0]
    assert replica.bodies[0] == replica.bodies[1], "the backend is sent the canonical text both times"


async def test_an_input_the_rules_empty_is_a_400_not_a_500() -> None:
    replica = ResponsesReplica()
    async with replicas(replica) as urls:
        config = gateway_config(urls, normalize={"roles": ["system", "user"]})
        async with gateway(config, None) as client:
            body = {"model": MODEL, "input": " \r\n ", "stream": True}
            async with client.post("/v1/responses", json=body) as reply:
                error = (await reply.json())["error"]
    assert reply.status == 400 and error["param"].startswith("input")
    assert replica.bodies == []
