"""The Responses API's tools, ``tool_choice`` and ``text.format`` with the official openai SDK, through a
real gateway to a bundled engine running SmolLM2: forced calls and JSON schemas are enforced by the
engine's grammar, so this 135M model's answers must be valid against their schemas, whole and streamed."""

import json
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.gateway_cluster import gateway_config, gateway_for
from tests.procs import ManagedProcess, free_port

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
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": WEATHER},
    {"type": "function", "name": "add", "description": "Add two integers", "parameters": ADD, "strict": True},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = "What is the weather in Paris?"
GET_WEATHER: Any = {"type": "function", "name": "get_weather"}

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str = Field(max_length=24)
    country: Literal["France", "Germany", "Italy", "Spain"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, real_engines: list[ManagedProcess]) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("responses-tools")
    with gateway_for(tmp_path, gateway_config(free_port(), real_engines[:1])) as process:
        yield process


@pytest.fixture
def client(gateway: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=600)


def check_call(item: Any, name: str) -> dict[str, Any]:
    """A function_call item in OpenAI's shape whose arguments are valid against its function's schema."""
    assert item.type == "function_call" and item.name == name and item.status == "completed"
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    arguments = json.loads(item.arguments)
    jsonschema.validate(arguments, SCHEMAS[name])
    return arguments


def test_a_named_tool_choice_returns_a_valid_function_call(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice=GET_WEATHER, temperature=0, max_output_tokens=60
    )
    assert response.status == "completed" and [item.type for item in response.output] == ["function_call"]
    check_call(response.output[0], "get_weather")
    assert response.tool_choice.name == "get_weather" and [tool.name for tool in response.tools] == [
        "get_weather",
        "add",
    ]


def test_a_streamed_forced_call_comes_as_function_call_events(client: openai.OpenAI) -> None:
    create: dict[str, Any] = {"model": MODEL, "input": ASK, "tools": TOOLS, "temperature": 0, "max_output_tokens": 60}
    whole = client.responses.create(**create, tool_choice=GET_WEATHER)
    events = list(client.responses.create(**create, tool_choice=GET_WEATHER, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    added, done, final = events[2], events[-2], events[-1].response
    assert added.item.type == "function_call" and added.item.status == "in_progress" and added.item.arguments == ""
    deltas = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    assert deltas == events[-3].arguments == done.item.arguments == final.output[0].arguments
    assert {event.item_id for event in events[3:-2]} == {added.item.id} == {final.output[0].id}
    assert check_call(done.item, "get_weather") == json.loads(whole.output[0].arguments), "greedy: same call"


def test_required_calls_one_of_the_tools(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="Add 2 and 3.", tools=TOOLS, tool_choice="required", temperature=0, max_output_tokens=60
    )
    assert [item.type for item in response.output] == ["function_call"]
    check_call(response.output[0], response.output[0].name)
    with client.responses.stream(
        model=MODEL, input="Add 2 and 3.", tools=TOOLS, tool_choice="required", temperature=0, max_output_tokens=60
    ) as stream:
        final = stream.get_final_response()
    assert final.output[0].name == response.output[0].name
    assert json.loads(final.output[0].arguments) == json.loads(response.output[0].arguments)


def test_a_call_and_its_output_in_the_input_give_a_text_answer(client: openai.OpenAI, gateway: ManagedProcess) -> None:
    """The conversation the Agents SDK sends back: the model's call, the tool's output; the gateway
    renders it (and the tools) as the engine does, so a repeat finds the whole prompt's blocks cached."""
    call = client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice=GET_WEATHER, temperature=0, max_output_tokens=60
    ).output[0]
    conversation: Any = [
        {"role": "user", "content": f"{ASK} ({uuid.uuid4().hex})"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21, "sky": "clear"}'},
    ]
    first = client.responses.create(
        model=MODEL, input=conversation, tools=TOOLS, tool_choice="none", temperature=0, max_output_tokens=20
    )
    assert [item.type for item in first.output] == ["message"] and first.output_text
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=conversation, tools=TOOLS, tool_choice="none", temperature=0, max_output_tokens=20
    )
    again = raw.parse()
    full_blocks = again.usage.input_tokens // 16 * 16
    assert again.usage.input_tokens == first.usage.input_tokens > 200, "tools and the call are in the prompt"
    assert again.usage.input_tokens_details.cached_tokens >= full_blocks - 16
    assert int(raw.headers["x-kvgate-predicted-cached-tokens"]) == again.usage.input_tokens_details.cached_tokens


def test_text_format_json_schema_is_valid_whole_and_streamed(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model=MODEL, input="Name a big city in Europe.", text_format=City, temperature=0, max_output_tokens=40
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)
    schema = City.model_json_schema()
    text = {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}}
    events = list(
        client.responses.create(
            model=MODEL, input="Name a big city in Europe.", text=text, temperature=0, max_output_tokens=40, stream=True
        )
    )
    streamed = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    jsonschema.validate(json.loads(streamed), schema)
    assert events[-1].type == "response.completed" and events[-1].response.text.format.type == "json_schema"
    assert json.loads(streamed) == parsed.output_parsed.model_dump()


def test_text_format_json_object_is_a_json_object(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input="Describe Paris as JSON.",
        text={"format": {"type": "json_object"}},
        temperature=0,
        max_output_tokens=60,
    )
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)
    else:
        assert response.output_text.startswith("{")


@pytest.mark.parametrize("tool", ["web_search", "web_search_preview", "file_search", "code_interpreter"])
def test_a_built_in_tool_is_refused_naming_it(client: openai.OpenAI, tool: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input=ASK, tools=[TOOLS[0], {"type": tool}])
    assert refused.value.body["param"] == "tools[1].type" and repr(tool) in refused.value.body["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "parameters": WEATHER}]}, "tools[0].name"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "tool_choice"),
    ],
)
def test_bad_tools_and_formats_get_openai_errors(client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input=ASK, **extra)
    assert refused.value.body["param"] == param and refused.value.body["message"]
