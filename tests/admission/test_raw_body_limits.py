"""Containers counted on the raw body before parsing, and the tools cap (issue 18.4)."""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission.config import LimitsConfig
from gateway.admission.input_limits import _containers_outside_strings, check_input, check_raw_body
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


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_brackets_inside_strings_are_not_counted(value: object) -> None:
    assert _containers_outside_strings(orjson.dumps(value)) == containers(value)
    assert _containers_outside_strings(orjson.dumps(value, option=orjson.OPT_INDENT_2)) == containers(value)


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
