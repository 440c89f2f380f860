"""The shared OpenAI schemas: unknown fields kept, bad known fields named, Responses input framed."""

import pytest

from protocol.openai import (
    ChatCompletionRequest,
    ResponsesRequest,
    chat_usage,
    responses_messages,
    validate,
)
from protocol.openai_errors import OpenAIError


def test_unknown_fields_are_kept_and_logprob_counts_follow_each_endpoint() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 3, "vendor_x": 1}
    request = validate(body, ChatCompletionRequest)
    assert request.num_logprobs == 3 and request.model_extra == {"vendor_x": 1}
    assert validate({"messages": body["messages"]}, ChatCompletionRequest).num_logprobs is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "1"}, "temperature"),
        ({}, "messages"),
    ],
)
def test_bad_known_fields_are_400s_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(OpenAIError) as raised:
        validate(body, ChatCompletionRequest)
    assert raised.value.status == 400 and raised.value.param == param


def test_responses_input_becomes_chat_messages_after_the_instructions() -> None:
    request = validate(
        {
            "instructions": "Be brief.",
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}],
                },
                {"type": "message", "role": "assistant", "content": "Hello"},
            ],
        },
        ResponsesRequest,
    )
    assert responses_messages(request) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello"},
    ]
    with pytest.raises(OpenAIError) as raised:
        responses_messages(validate({"input": "hi", "previous_response_id": "resp_1"}, ResponsesRequest))
    assert raised.value.param == "previous_response_id"


def test_responses_usage_reads_as_chat_usage() -> None:
    usage = {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2, "total_tokens": 11}
    assert chat_usage(usage) == {
        "prompt_tokens": 9,
        "completion_tokens": 2,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
