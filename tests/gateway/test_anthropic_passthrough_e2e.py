"""Messages passed through to a backend that serves ``/v1/messages`` itself (``anthropic_messages``),
with the official anthropic SDK in front of a real gateway process.

The native backend is a third-party stand-in (tests/gateway/anthropic_messages_backend.py) in its own
process; the mixed fleet adds a bundled ``--sim`` engine, which is answered through translation.
"""

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from bench.harness.processes import module_command
from tests.gateway.anthropic_messages_backend import (
    ANSWER,
    CACHE_CREATION_TOKENS,
    CACHE_READ_TOKENS,
    INPUT_TOKENS,
    MODEL,
)
from tests.gateway_cluster import INSTANT_SIM, gateway_config, gateway_for, running, start_engine_set
from tests.procs import ManagedProcess, free_port, http, start

KEY = "sk-team"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
NATIVE_TEXT = "".join(ANSWER)
NATIVE_PROMPT = INPUT_TOKENS + CACHE_READ_TOKENS + CACHE_CREATION_TOKENS
TENANTS = [{"name": "team", "api_keys": [KEY], "tokens_per_minute": 100_000}]

pytestmark = pytest.mark.slow


def start_native_backend(tmp_path: Path) -> ManagedProcess:
    port = free_port()
    command = module_command("tests.gateway.anthropic_messages_backend", "--port", str(port))
    return start(command, port, tmp_path / f"native-{port}.log")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A native-only gateway and a mixed-fleet one (native + bundled sim engine, round robin)."""
    tmp_path = tmp_path_factory.mktemp("anthropic-passthrough")
    native = start_native_backend(tmp_path)
    with running([native, *start_engine_set(tmp_path, [INSTANT_SIM])]) as (_, engine):
        native_backend = {"name": "native", "url": native.url, "anthropic_messages": True}
        only = gateway_config(free_port(), [], tenants=TENANTS)
        only["backends"] = [native_backend]
        only["observability"] = {"request_log_path": str(tmp_path / "requests.log")}
        mixed = gateway_config(free_port(), [engine], tenants=TENANTS, routing={"policy": "round_robin"})
        mixed["backends"].append(native_backend)
        with (
            gateway_for(_mkdir(tmp_path / "only"), only) as only_gateway,
            gateway_for(_mkdir(tmp_path / "mixed"), mixed) as mixed_gateway,
        ):
            yield {
                "native": native,
                "only": only_gateway,
                "mixed": mixed_gateway,
                "log": tmp_path / "requests.log",
            }


def _mkdir(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


def client_of(gateway: ManagedProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)


def logged(log: Path, request_id: str) -> dict[str, Any]:
    """The request log's line for ``request_id`` (it is written once the request has ended)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else []:
            record = orjson.loads(line)
            if record.get("request_id") == request_id:
                return record
        time.sleep(0.05)
    raise AssertionError(f"no request log line for {request_id}")


def received(native: ManagedProcess) -> list[dict[str, Any]]:
    bodies = http("GET", f"{native.url}/received").json()
    assert isinstance(bodies, list)
    return bodies


def test_create_gets_the_native_answer_and_the_backend_gets_the_anthropic_body(fleet: dict[str, Any]) -> None:
    request_id = f"native-{uuid.uuid4().hex}"
    system = "You   answer briefly.  "
    raw = client_of(fleet["only"]).messages.with_raw_response.create(
        model=MODEL,
        max_tokens=64,
        system=system,
        messages=QUESTION,
        stop_sequences=["\n\n"],
        extra_headers={"x-request-id": request_id},
    )
    message = raw.parse()
    assert message.id == "msg_native_1" and message.model == MODEL
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == NATIVE_TEXT
    assert message.usage.input_tokens == INPUT_TOKENS
    assert message.usage.cache_read_input_tokens == CACHE_READ_TOKENS
    assert raw.headers["x-kvgate-backend"] == "native" and raw.request_id == request_id
    body = received(fleet["native"])[-1]
    assert body["messages"] == QUESTION and body["system"] == system, "passed through unnormalized"
    assert body["max_tokens"] == 64 and body["stop_sequences"] == ["\n\n"] and body["model"] == MODEL
    record = logged(fleet["log"], request_id)
    assert record["backend"] == "native" and record["status"] == "200"
    assert record["cached_tokens"] == CACHE_READ_TOKENS and record["completion_tokens"] == len(ANSWER)
    assert record["charged_tokens"] == NATIVE_PROMPT + len(ANSWER)


def test_stream_relays_the_native_events_and_charges_their_usage(fleet: dict[str, Any]) -> None:
    request_id = f"native-stream-{uuid.uuid4().hex}"
    client = client_of(fleet["only"])
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=QUESTION, extra_headers={"x-request-id": request_id}
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == NATIVE_TEXT and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(ANSWER)
    assert received(fleet["native"])[-1]["stream"] is True
    record = logged(fleet["log"], request_id)
    assert record["cached_tokens"] == CACHE_READ_TOKENS and record["completion_tokens"] == len(ANSWER)
    assert record["charged_tokens"] == NATIVE_PROMPT + len(ANSWER)


def test_the_cap_cuts_a_native_stream_that_goes_past_max_tokens(fleet: dict[str, Any]) -> None:
    request_id = f"native-long-{uuid.uuid4().hex}"
    long_prompt = [{"role": "user", "content": "Talk for a long time [long]"}]
    client = client_of(fleet["only"])
    with client.messages.stream(
        model=MODEL, max_tokens=5, messages=long_prompt, extra_headers={"x-request-id": request_id}
    ) as stream:
        deltas = [event for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert len(deltas) == 5 and final.content[0].text == "x" * 5
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    record = logged(fleet["log"], request_id)
    assert record["completion_tokens"] == 5 and record["charged_tokens"] == record["prompt_tokens"] + 5
    assert record["cached_tokens"] == CACHE_READ_TOKENS, "the cache hits message_start reported"


def test_a_native_backend_error_keeps_anthropic_shape(fleet: dict[str, Any]) -> None:
    refused = [{"role": "user", "content": "please [refuse]"}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client_of(fleet["only"]).messages.create(model=MODEL, max_tokens=8, messages=refused)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and "refuses" in body["error"]["message"]


def test_more_than_four_stop_sequences_are_refused_naming_stop_sequences(fleet: dict[str, Any]) -> None:
    before = len(received(fleet["native"]))
    with pytest.raises(anthropic.BadRequestError) as caught:
        client_of(fleet["only"]).messages.create(
            model=MODEL, max_tokens=8, messages=QUESTION, stop_sequences=["a", "b", "c", "d", "e"]
        )
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    assert "'stop_sequences'" in message and "'stop'" not in message
    assert len(received(fleet["native"])) == before, "refused before any backend"


def test_a_mixed_fleet_serves_native_and_translated(fleet: dict[str, Any]) -> None:
    """Round robin over a native backend and a sim engine: three whole answers, then three streams,
    so each replica serves both."""
    client = client_of(fleet["mixed"])
    answers: dict[tuple[str, str], set[str]] = {}
    for _ in range(3):
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=8, messages=QUESTION)
        answers.setdefault((raw.headers["x-kvgate-backend"], "whole"), set()).add(raw.parse().content[0].text)
    for _ in range(3):
        with client.messages.stream(model=MODEL, max_tokens=8, messages=QUESTION) as stream:
            streamed = stream.get_final_message()
        assert streamed.usage.output_tokens > 0
        answers.setdefault((stream.response.headers["x-kvgate-backend"], "stream"), set()).add(streamed.content[0].text)
    assert set(answers) == {(backend, way) for backend in ("native", "e0") for way in ("whole", "stream")}
    assert answers["native", "whole"] == answers["native", "stream"] == {NATIVE_TEXT}
    assert NATIVE_TEXT not in answers["e0", "whole"] | answers["e0", "stream"], "the sim engine answered, translated"
