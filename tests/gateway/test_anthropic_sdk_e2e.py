"""The official anthropic SDK through a real gateway in front of two bundled engines running SmolLM2."""

import json
import uuid
from collections.abc import Iterator

import anthropic
import pytest

from tests.gateway_cluster import gateway_config, gateway_for
from tests.procs import ManagedProcess, free_port, http

MODEL = "smollm2-135m"
KEY = "sk-team"
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, real_engines: list[ManagedProcess]
) -> Iterator[tuple[ManagedProcess, list[ManagedProcess]]]:
    tmp_path = tmp_path_factory.mktemp("anthropic-sdk")
    tenants = [
        {"name": "team", "api_keys": [KEY]},
        {"name": "tight", "api_keys": ["sk-tight"], "requests_per_minute": 1},
    ]
    config = gateway_config(free_port(), real_engines, tenants=tenants, routing={"policy": "cache_aware"})
    with gateway_for(tmp_path, config) as gateway:
        yield gateway, real_engines


@pytest.fixture
def gateway(deployment: tuple[ManagedProcess, list[ManagedProcess]]) -> ManagedProcess:
    return deployment[0]


@pytest.fixture
def client(gateway: ManagedProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)


def prompt_total(usage: anthropic.types.Usage) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def test_messages_create_answers_in_anthropic_shape(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=16, messages=QUESTION, extra_body=GREEDY)
    message = raw.parse()
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    assert [block.type for block in message.content] == ["text"]
    assert "Paris" in message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 0 < message.usage.output_tokens <= 16
    assert raw.headers["x-request-id"] and raw.headers["x-kvgate-backend"]
    assert raw.request_id == raw.headers["x-request-id"]


def test_max_tokens_stop_reason(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=2, messages=QUESTION, extra_body=GREEDY)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


def test_streaming_events_come_in_anthropic_order_and_equal_the_whole_answer(client: anthropic.Anthropic) -> None:
    system = [{"type": "text", "text": "You answer in one short sentence."}]
    whole = client.messages.create(model=MODEL, max_tokens=20, system=system, messages=QUESTION, extra_body=GREEDY)
    events = list(
        client.messages.create(
            model=MODEL, max_tokens=20, system=system, messages=QUESTION, extra_body=GREEDY, stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    text = "".join(event.delta.text for event in events if event.type == "content_block_delta")
    assert text == whole.content[0].text
    final = events[-2]
    assert final.delta.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert prompt_total(final.usage) == prompt_total(whole.usage)


def test_the_raw_stream_opens_with_a_ping(gateway: ManagedProcess) -> None:
    """The SDK drops pings, so the wire is read here: event names in order, each with its data's type."""
    body = {"model": MODEL, "max_tokens": 4, "messages": QUESTION, "stream": True}
    reply = http("POST", f"{gateway.url}/v1/messages", body, {"x-api-key": KEY})
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
    events = [event for event in reply.body.decode().split("\n\n") if event.strip()]
    names = [event.split("\n")[0].removeprefix("event: ") for event in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-1] == "message_stop"
    for event, name in zip(events, names, strict=True):
        assert json.loads(event.split("\n")[1].removeprefix("data: "))["type"] == name


def test_stream_helper_assembles_the_final_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=12, messages=QUESTION, extra_body=GREEDY) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == streamed_text and "Paris" in streamed_text
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0


def test_count_tokens_equals_the_prompt_the_engine_saw(client: anthropic.Anthropic) -> None:
    system = f"Request {uuid.uuid4().hex}: you are terse."
    counted = client.messages.count_tokens(model=MODEL, system=system, messages=QUESTION)
    message = client.messages.create(model=MODEL, max_tokens=1, system=system, messages=QUESTION)
    assert counted.input_tokens == prompt_total(message.usage) > 10


def test_cache_control_reports_the_engines_cached_tokens(
    client: anthropic.Anthropic, deployment: tuple[ManagedProcess, list[ManagedProcess]]
) -> None:
    """A long system prompt marked for caching: the first call writes it to the cache (and the engine
    retains it under the breakpoint's session), the second reads it; ``cache_read_input_tokens``
    equals the prefix-cache hits the serving engine counted."""
    _, engines = deployment
    long_system = f"Session {uuid.uuid4().hex}. " + "You answer questions about European geography. " * 40
    system = [{"type": "text", "text": long_system, "cache_control": {"type": "ephemeral", "ttl": "5m"}}]
    hits_before = {engine.url: prefix_cache_hits(engine) for engine in engines}
    first = client.messages.with_raw_response.create(model=MODEL, max_tokens=2, system=system, messages=QUESTION)
    second_question = [{"role": "user", "content": "And the capital of Spain?"}]
    second = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=2, system=system, messages=second_question
    )
    assert first.headers["x-kvgate-backend"] == second.headers["x-kvgate-backend"]
    engine = engines[int(second.headers["x-kvgate-backend"].removeprefix("e"))]
    written, read = first.parse().usage, second.parse().usage
    assert written.cache_read_input_tokens == 0 and written.cache_creation_input_tokens > 300
    stats = http("GET", f"{engine.url}/stats").json()
    assert isinstance(stats, dict) and stats["retained_free_blocks"] * 16 >= written.cache_creation_input_tokens
    assert read.cache_read_input_tokens == prefix_cache_hits(engine) - hits_before[engine.url] > 300
    assert read.cache_creation_input_tokens == 0
    # all of the prefix written is read back (and the engine's last block may reach past the breakpoint)
    assert read.cache_read_input_tokens >= written.cache_creation_input_tokens
    counted = client.messages.count_tokens(model=MODEL, system=system, messages=second_question)
    assert prompt_total(read) == counted.input_tokens


def prefix_cache_hits(engine: ManagedProcess) -> int:
    """The engine's ``vllm:prefix_cache_hits`` counter (prompt tokens served from its cache)."""
    text = http("GET", f"{engine.url}/metrics").body.decode()
    for line in text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total") or line.startswith("vllm:prefix_cache_hits{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("the engine exports no vllm:prefix_cache_hits")


def test_forced_tool_choice_returns_a_tool_use_block_matching_the_schema(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    )
    tool_uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and len(tool_uses) == 1
    assert tool_uses[0].name == "get_weather"
    assert set(tool_uses[0].input) == {"city", "unit"}
    assert isinstance(tool_uses[0].input["city"], str) and tool_uses[0].input["unit"] in ("celsius", "fahrenheit")


def test_forced_tool_streams_as_input_json_deltas(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL,
        max_tokens=64,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    tool_use = next(block for block in final.content if block.type == "tool_use")
    assert "input_json" in kinds and final.stop_reason == "tool_use"
    assert set(tool_use.input) == {"city", "unit"}


def test_a_tool_result_conversation_is_answered(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=16,
        tools=[WEATHER_TOOL],
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris", "unit": "celsius"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 degrees, sunny"}],
            },
        ],
    )
    assert message.usage.output_tokens > 0 and message.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_missing_max_tokens_is_an_anthropic_invalid_request(gateway: ManagedProcess) -> None:
    reply = http("POST", f"{gateway.url}/v1/messages", {"model": MODEL, "messages": QUESTION}, {"x-api-key": KEY})
    assert reply.status == 400
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"] and body["request_id"] == reply.headers["x-request-id"]


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        (
            "messages",
            [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
            "image",
        ),
        ("thinking", {"type": "enabled", "budget_tokens": 1024}, "thinking"),
        ("tool_choice", {"type": "tool", "name": "nope"}, "tool_choice"),
    ],
)
def test_unsupported_input_is_refused_by_name(
    client: anthropic.Anthropic, field: str, value: object, named: str
) -> None:
    body = {"model": MODEL, "max_tokens": 4, "messages": QUESTION, "tools": [WEATHER_TOOL], field: value}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    assert refused.value.status_code == 400
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert named in refused.value.body["error"]["message"]


def test_a_prompt_past_the_context_is_refused_in_anthropic_shape_when_streaming(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=4000, messages=QUESTION, stream=True)
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert refused.value.request_id


def test_a_bad_x_api_key_is_an_authentication_error(gateway: ManagedProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client.messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.count_tokens(model=MODEL, messages=QUESTION)


def test_an_admission_429_is_a_rate_limit_error(gateway: ManagedProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key="sk-tight", max_retries=0)
    client.messages.create(model=MODEL, max_tokens=1, messages=QUESTION)
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model=MODEL, max_tokens=1, messages=QUESTION)
    assert refused.value.body["error"]["type"] == "rate_limit_error"
    assert refused.value.response.headers["retry-after"]


def test_an_unknown_path_names_itself_and_carries_a_request_id(gateway: ManagedProcess) -> None:
    reply = http("GET", f"{gateway.url}/v1/nowhere", headers={"x-request-id": "probe-42"})
    assert reply.status == 404
    assert "/v1/nowhere" in reply.json()["error"]["message"]
    assert reply.headers["x-request-id"] == "probe-42"
    wrong_method = http("GET", f"{gateway.url}/v1/messages")
    assert wrong_method.status == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"
    assert wrong_method.headers["x-request-id"]
