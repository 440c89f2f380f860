import pytest

from gateway.admission.config import LimitsConfig
from gateway.admission.input_limits import check_input
from gateway.errors import OpenAIError

LIMITS = LimitsConfig(max_messages=3, max_content_chars=10, max_json_depth=5)


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "x"}] * 4},
        {"messages": [{"role": "user", "content": "x" * 11}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 6}] * 2}]},
        {"prompt": "x" * 11},
        {"prompt": "x", "extra": nested(10)},
    ],
)
def test_oversized_shapes_are_400(body: dict) -> None:
    with pytest.raises(OpenAIError) as error:
        check_input(body, LIMITS)
    assert error.value.status == 400


def test_bodies_within_limits_pass() -> None:
    check_input({"messages": [{"role": "user", "content": "x" * 10}] * 3, "extra": nested(3)}, LIMITS)
    check_input({"prompt": [1, 2, 3]}, LIMITS)


def test_depth_check_is_not_recursive() -> None:
    with pytest.raises(OpenAIError):
        check_input({"prompt": "x", "extra": nested(100_000)}, LimitsConfig())


def test_embedding_and_responses_inputs_are_capped_like_prompts() -> None:
    limits = LimitsConfig(max_content_chars=10, max_messages=2)
    check_input({"input": ["short", "x" * 5]}, limits)
    for body, param in (
        ({"input": "x" * 11}, "input"),
        ({"input": ["ok", "x" * 11]}, "input.1"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x" * 11}]}]}, "input.0.content"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x" * 11}]}, "input.0.output"),
        ({"input": [{"type": "function_call", "call_id": "c", "arguments": "x" * 11}]}, "input.0.arguments"),
        ({"input": ["a", "b", "c"]}, "input"),
        ({"input": "hi", "instructions": "x" * 11}, "instructions"),
    ):
        with pytest.raises(OpenAIError) as error:
            check_input(body, limits)
        assert error.value.status == 400 and error.value.param == param
