"""Tools and structured outputs as clients send them: the openai SDK and LangChain, through the gateway,
to a bundled engine running SmolLM2. A forced or required tool call and a JSON schema are enforced by
the engine's grammar, so even this 135M model's answers must be valid against their schemas."""

import json
import uuid
from collections.abc import Iterator
from typing import Literal

import jsonschema
import openai
import pytest
import yaml
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.procs import ManagedProcess, free_port, http, start_gateway

MODEL = "smollm2-135m"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather of a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=24)
    country: Literal["France", "Germany", "Italy", "Spain"]


class Loose(BaseModel):
    """json_mode promises a JSON object only, not a schema: every field has a default."""

    name: str = ""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, real_engines: list[ManagedProcess]) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("tools")
    engine = real_engines[0]
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": MODEL,
        "backends": [{"name": "engine-0", "url": engine.url}],
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    process = start_gateway(tmp_path, config_path, port)
    yield process
    process.stop()


@pytest.fixture
def client(gateway: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture
def chat_model(gateway: ManagedProcess) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{gateway.url}/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=40, max_retries=0
    )


def test_response_format_json_schema_is_valid_against_its_schema(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a big city in Europe."}],
        response_format=City,
        max_tokens=40,
        temperature=0,
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, City)
    jsonschema.validate(json.loads(message.content), City.model_json_schema())


def test_forced_and_required_tool_calls_match_their_schemas(client: openai.OpenAI) -> None:
    forced = client.chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
    )
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)

    required = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=TOOLS, tool_choice="required", max_tokens=40, temperature=0
    )
    [call] = required.choices[0].message.tool_calls
    schema = next(tool["function"]["parameters"] for tool in TOOLS if tool["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), schema)

    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=40,
        temperature=0,
        stream=True,
    )
    heads, arguments, finish = [], "", None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.id is not None:
                heads.append((delta.id, delta.type, delta.function.name))
            arguments += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert len(heads) == 1 and heads[0][0].startswith("call_") and heads[0][1:] == ("function", call.function.name)
    assert arguments == call.function.arguments
    assert finish == "tool_calls"


def test_an_unenforceable_schema_is_a_400_naming_it(gateway: ManagedProcess) -> None:
    schema = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
    reply = http(
        "POST",
        f"{gateway.url}/v1/chat/completions",
        {
            "model": MODEL,
            "messages": ASK_WEATHER,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        },
    )
    assert reply.status == 400, reply.body
    error = reply.json()["error"]  # type: ignore[index]
    assert "not" in error["message"] and error["param"].startswith("response_format")


def test_langchain_bind_tools_with_a_forced_tool_whole_and_streamed(chat_model: ChatOpenAI) -> None:
    bound = chat_model.bind_tools(TOOLS, tool_choice="get_weather")
    answer = bound.invoke("What is the weather in Paris?")
    assert isinstance(answer, AIMessage)
    [call] = answer.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(call["args"], WEATHER)
    chunks = list(bound.stream("What is the weather in Paris?"))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk
    [streamed_call] = streamed.tool_calls  # type: ignore[attr-defined]
    assert (streamed_call["name"], streamed_call["args"]) == (call["name"], call["args"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(chat_model: ChatOpenAI, method: str) -> None:
    schema = Loose if method == "json_mode" else City
    structured = chat_model.with_structured_output(schema, method=method)  # type: ignore[arg-type]
    result = structured.invoke("Name a big city in Europe, as JSON.")
    assert isinstance(result, schema)


def test_tool_definitions_in_any_key_order_hit_the_same_cached_prefix(client: openai.OpenAI) -> None:
    """The gateway sorts tool-schema keys (``canonical_tools``), so a client that reorders them still
    reuses the prefix its tool definitions rendered into the prompt."""
    reordered = [{"function": dict(reversed(tool["function"].items())), "type": "function"} for tool in TOOLS]
    messages = [{"role": "system", "content": f"Session {uuid.uuid4().hex}."}, *ASK_WEATHER]
    usages = [
        client.chat.completions.create(
            model=MODEL, messages=messages, tools=tools, tool_choice="none", max_tokens=1
        ).usage
        for tools in (TOOLS, reordered)
    ]
    assert usages[0].prompt_tokens == usages[1].prompt_tokens > 100
    assert usages[1].prompt_tokens_details.cached_tokens == (usages[1].prompt_tokens - 1) // 16 * 16
