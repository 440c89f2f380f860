"""The simulated engine's ``/v1/responses``: what needs a grammar is refused by name, built-in tools
too, and ``auto`` tools still answer (free text, parsed)."""

from collections.abc import Iterator

import pytest

from tests.engine.test_server_sim import FAST_SIM, MODEL
from tests.procs import ManagedProcess, http, start_engine

TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    process = start_engine(
        tmp_path_factory.mktemp("sim-responses"), *FAST_SIM, "--num-blocks", "64", "--max-model-len", "1024"
    )
    yield process
    process.stop()


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"text": {"format": {"type": "json_object"}}}, "text.format", "unsupported_parameter"),
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice", "unsupported_parameter"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "f"}}, "tool_choice", "unsupported_parameter"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type", "unsupported_value"),
        ({"tools": TOOLS, "tool_choice": {"type": "file_search"}}, "tool_choice", "unsupported_value"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "invalid_value"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_by_name(
    engine: ManagedProcess, fields: dict, param: str, code: str
) -> None:
    reply = http("POST", f"{engine.url}/v1/responses", {"model": MODEL, "input": "hi", **fields})
    assert reply.status == 400, reply.body
    error = reply.json()["error"]  # type: ignore[index]
    assert error["param"].startswith(param) and error["code"] == code


def test_auto_tools_and_a_call_in_the_input_still_answer(engine: ManagedProcess) -> None:
    conversation = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"},
    ]
    body = {"model": MODEL, "input": conversation, "tools": TOOLS, "max_output_tokens": 4}
    reply = http("POST", f"{engine.url}/v1/responses", body)
    assert reply.status == 200, reply.body
    response = reply.json()
    assert response["output"][0]["type"] == "message" and response["tools"] == TOOLS  # type: ignore[index]
