"""The Anthropic front end's translation, both ways, on its own (no processes)."""

from typing import Any

import orjson
import pytest

from gateway.anthropic.errors import error_type
from gateway.anthropic.request import CACHE_KEY_PREFIX, chat_body, prefix_messages, prompt_body
from gateway.anthropic.response import CacheAccounting, anthropic_usage, whole_message
from gateway.anthropic.stream import StreamTranslator
from protocol.anthropic import CountTokensRequest, MessagesRequest, validate_anthropic
from protocol.openai_errors import OpenAIError

TOOL = {"name": "lookup", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}
    return validate_anthropic(body, MessagesRequest)


def test_system_blocks_tools_and_results_become_chat_messages() -> None:
    translated = chat_body(
        request(
            system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            tools=[TOOL],
            messages=[
                {"role": "user", "content": "find x"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "looking"},
                        {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "x"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}]},
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
            stop_sequences=["END"],
            temperature=0.5,
            top_k=5,
        )
    )
    body = translated.body
    assert body["messages"] == [
        {"role": "system", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
        {"role": "user", "content": "find x"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "looking"}],
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": '{"q":"x"}'}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    ]
    assert body["tools"] == [{"type": "function", "function": {"name": "lookup", "parameters": TOOL["input_schema"]}}]
    assert (body["stop"], body["temperature"], body["top_k"], body["max_tokens"]) == (["END"], 0.5, 5, 8)
    assert "user" not in body and "stream" not in body and translated.ttl is None


@pytest.mark.parametrize(
    ("choice", "mapped"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "lookup"}, {"type": "function", "function": {"name": "lookup"}}),
    ],
)
def test_tool_choice_maps_to_openai(choice: dict[str, Any], mapped: object) -> None:
    assert chat_body(request(tools=[TOOL], tool_choice=choice)).body["tool_choice"] == mapped


def test_disabling_parallel_tool_use_maps_to_parallel_tool_calls() -> None:
    body = chat_body(request(tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True})).body
    assert body["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"tool_choice": {"type": "tool", "name": "other"}, "tools": [TOOL]}, "tool_choice.name"),
        ({"tool_choice": {"type": "tool"}, "tools": [TOOL]}, "tool_choice.name"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"output_config": {"effort": "high"}}, "output_config.effort"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "The"}]}, "prefill"),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]},
                    {"role": "user", "content": "go on"},
                ]
            },
            "messages.0",
        ),
    ],
)
def test_requests_the_translation_cannot_honour_are_refused_by_name(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        chat_body(request(**fields))
    assert refused.value.status == 400 and named in refused.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages.0.content.0",
        ),
        ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "thinking": {}}, "thinking"),
        ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5},
            "temperature",
        ),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        validate_anthropic(body, MessagesRequest)
    assert refused.value.status == 400 and refused.value.param == param and param in refused.value.message


def test_output_config_format_becomes_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = chat_body(request(output_config={"format": {"type": "json_schema", "schema": schema}})).body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


def test_a_cached_prefix_names_one_session_whatever_follows_it() -> None:
    system = [{"type": "text", "text": "long rules", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    first = chat_body(request(system=system, messages=[{"role": "user", "content": "one"}]))
    second = chat_body(request(system=system, messages=[{"role": "user", "content": "two"}]))
    other_user = chat_body(request(system=system, metadata={"user_id": "u2"}))
    assert first.body["user"] == second.body["user"] != other_user.body["user"]
    assert first.body["user"].startswith(CACHE_KEY_PREFIX) and first.ttl == "1h"
    assert first.breakpoint is not None and (first.breakpoint.message, first.breakpoint.part) == (0, 0)
    assert chat_body(request(metadata={"user_id": "u1"})).body["user"] == "u1"


def test_breakpoints_on_a_message_part_and_top_level_cut_the_prefix_there() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "doc", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "question"},
            ],
        }
    ]
    translated = chat_body(request(system="sys", messages=messages))
    assert translated.breakpoint is not None
    assert prefix_messages(translated.body["messages"], translated.breakpoint) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "doc"}]},
    ]
    top = prompt_body(
        validate_anthropic(
            {"model": "m", "messages": messages[:1], "cache_control": {"type": "ephemeral"}}, CountTokensRequest
        )
    )
    assert top.breakpoint is not None and (top.breakpoint.message, top.breakpoint.part, top.ttl) == (0, 1, "5m")


def test_usage_splits_the_prompt_into_read_created_and_the_rest() -> None:
    accounting = CacheAccounting(breakpoint_tokens=70, block_size=16, ttl="5m")
    usage = {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 32}}
    split = anthropic_usage(usage, accounting)
    assert split["cache_read_input_tokens"] == 32
    assert split["cache_creation_input_tokens"] == 64 - 32
    assert split["input_tokens"] + split["cache_read_input_tokens"] + split["cache_creation_input_tokens"] == 100
    assert split["cache_creation"] == {"ephemeral_5m_input_tokens": 32, "ephemeral_1h_input_tokens": 0}
    warm = anthropic_usage({**usage, "prompt_tokens_details": {"cached_tokens": 96}}, accounting)
    assert (warm["cache_creation_input_tokens"], warm["input_tokens"]) == (0, 4)
    none = anthropic_usage(usage, CacheAccounting(0, 16, None))
    assert (none["cache_creation_input_tokens"], none["input_tokens"]) == (0, 68) and "cache_creation" not in none


def test_a_whole_completion_with_tool_calls_becomes_tool_use_blocks() -> None:
    completion = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "lookup", "arguments": '{"q": "x"}'}},
                        {"id": "c2", "function": {"name": "lookup", "arguments": "not json"}},
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }
    message = whole_message(completion, "m", [], CacheAccounting(0, 16, None))
    assert message["content"] == [
        {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"q": "x"}},
        {"type": "text", "text": "not json"},
    ]
    assert message["stop_reason"] == "tool_use" and message["usage"]["output_tokens"] == 5


@pytest.mark.parametrize(
    ("choice", "reason", "sequence"),
    [
        ({"finish_reason": "stop"}, "end_turn", None),
        ({"finish_reason": "length"}, "max_tokens", None),
        ({"finish_reason": "stop", "stop_reason": "END"}, "stop_sequence", "END"),
        ({"finish_reason": "stop", "stop_reason": 2}, "end_turn", None),
    ],
)
def test_stop_reasons(choice: dict[str, Any], reason: str, sequence: str | None) -> None:
    choice = {**choice, "message": {"content": "x"}}
    message = whole_message({"choices": [choice]}, "m", ["END"], CacheAccounting(0, 16, None))
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + orjson.dumps({"object": "chat.completion.chunk", "choices": choices, "usage": usage}) + b"\n\n"


def events_of(data: bytes) -> list[dict[str, Any]]:
    events = []
    for event in data.split(b"\n\n"):
        if event.strip():
            name, payload = event.split(b"\n")
            parsed = orjson.loads(payload.removeprefix(b"data: "))
            assert name == b"event: " + parsed["type"].encode()
            events.append(parsed)
    return events


def test_a_stream_of_text_then_a_tool_call_translates_in_order() -> None:
    translator = StreamTranslator("msg_1", "m", 20, [], CacheAccounting(0, 16, None))
    wire = translator.opening()
    wire += translator.feed(chunk({"role": "assistant", "content": "Let me"}))
    wire += translator.feed(chunk({"content": " check."}))
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q"'}}
    wire += translator.feed(chunk({"tool_calls": [call]}))
    wire += translator.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "x"}'}}]}, "tool_calls"))
    usage = {"prompt_tokens": 20, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 16}}
    wire += translator.feed(chunk(usage=usage) + b"data: [DONE]\n\n")
    events = events_of(wire)
    assert [(event["type"], event.get("index")) for event in events] == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[6]["content_block"] == {"type": "tool_use", "id": "c1", "name": "lookup", "input": {}}
    assert "".join(event["delta"].get("partial_json", "") for event in events[7:9]) == '{"q": "x"}'
    assert events[10]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[10]["usage"] == {
        "input_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 16,
        "output_tokens": 7,
    }
    assert translator.feed(chunk({"content": "late"})) == b""


def test_a_broken_backend_stream_ends_with_an_error_event() -> None:
    translator = StreamTranslator("msg_1", "m", 5, [], CacheAccounting(0, 16, None))
    translator.feed(chunk({"content": "a"}))
    failure = b"data: " + orjson.dumps(OpenAIError(502, "backend stream ended", "upstream_error").body()) + b"\n\n"
    events = events_of(translator.feed(failure))
    assert events == [{"type": "error", "error": {"type": "api_error", "message": "backend stream ended"}}]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
     (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"), (503, "overloaded_error")],
)  # fmt: skip
def test_error_types_follow_the_status(status: int, kind: str) -> None:
    assert error_type(status) == kind
