"""Containers counted on the raw body before parsing, and the tools cap (issue 18.4)."""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission.config import LimitsConfig
from gateway.admission.input_limits import _byte_counts, _counts_outside_strings, check_input, check_raw_body
from gateway.errors import OpenAIError

LIMITS = LimitsConfig(max_json_containers=100, max_tools=2)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(alphabet='{}[]"\\ab\u00e9', max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text('{["\\x', max_size=4), children, max_size=4)
    ),
    max_leaves=30,
)


def containers(value: object) -> int:
    if isinstance(value, dict):
        return 1 + sum(containers(child) for child in value.values())
    if isinstance(value, list):
        return 1 + sum(containers(child) for child in value)
    return 0


def values_and_keys(value: object) -> tuple[int, int]:
    """Values as counted on the bytes (members and elements, plus one per empty container), and keys."""
    children = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    if not isinstance(value, (dict, list)):
        return 0, 0
    below = [values_and_keys(child) for child in children]
    keys = len(value) if isinstance(value, dict) else 0
    return max(len(children), 1) + sum(count for count, _ in below), keys + sum(count for _, count in below)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_brackets_commas_and_colons_inside_strings_are_not_counted(value: object) -> None:
    expected = (containers(value), *values_and_keys(value))
    assert _counts_outside_strings(orjson.dumps(value)) == expected
    assert _counts_outside_strings(orjson.dumps(value, option=orjson.OPT_INDENT_2)) == expected


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ({"prompt": [7] * 300}, "JSON values"),
        ({"prompt": "x", "metadata": {f"k{index}": 0 for index in range(150)}}, "JSON object keys"),
        ({"stop": ["a,b:c"] * 150, "logit_bias": {str(index): 1 for index in range(90)}}, "JSON values"),
    ],
)
def test_flat_bodies_with_too_many_values_or_keys_are_refused_before_parsing(body: dict, what: str) -> None:
    """Issue 28.10: a flat array or a wide object is one container, yet parsing it held the loop for seconds."""
    limits = LimitsConfig(max_json_containers=100, max_json_values=200, max_json_keys=100)
    with pytest.raises(OpenAIError) as error:
        check_raw_body(orjson.dumps(body), limits)
    assert error.value.status == 400 and error.value.code == "too_many_json_values" and what in error.value.message
    check_raw_body(orjson.dumps({"prompt": "a, b: c, d: e" * 100}), limits)


def test_many_small_objects_are_refused_before_parsing() -> None:
    with pytest.raises(OpenAIError) as error:
        check_raw_body(orjson.dumps({"x": [{}] * 150}), LIMITS)
    assert error.value.status == 400 and error.value.code == "too_many_json_values"


def test_code_in_a_prompt_is_not_a_container() -> None:
    check_raw_body(orjson.dumps({"prompt": "if (a[0]) { b[1] = {}; }" * 100}), LIMITS)


def test_too_many_tools_are_refused() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    check_input({"messages": [], "tools": [tool] * 2}, LIMITS)
    with pytest.raises(OpenAIError) as error:
        check_input({"messages": [], "tools": [tool] * 3}, LIMITS)
    assert error.value.param == "tools" and error.value.code == "too_many_tools"


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_the_vectorized_byte_counts_are_the_counts_of_each_byte(raw: bytes) -> None:
    containers, commas, keys = _byte_counts(raw)
    assert containers == raw.count(b"{") + raw.count(b"[")
    assert (commas, keys) == (raw.count(b","), raw.count(b":"))
