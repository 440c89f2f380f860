"""The simulated engine cannot follow a grammar: it refuses what needs one with a 400 naming the field,
and still answers ``auto`` tools (free text, parsed) and plain requests."""

from collections.abc import Iterator

import pytest

from tests.engine.test_server_sim import FAST_SIM, MODEL
from tests.procs import ManagedProcess, http, start_engine

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    process = start_engine(
        tmp_path_factory.mktemp("sim-grammar"), *FAST_SIM, "--num-blocks", "64", "--max-model-len", "1024"
    )
    yield process
    process.stop()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"guided_choice": ["a", "b"]}, "guided_choice"),
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ],
)
def test_a_constraint_is_refused_by_name(engine: ManagedProcess, fields: dict, param: str) -> None:
    reply = http("POST", f"{engine.url}/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, **fields})
    assert reply.status == 400, reply.body
    error = reply.json()["error"]  # type: ignore[index]
    assert error["param"] == param and error["code"] == "unsupported_parameter"


def test_auto_tools_and_text_format_still_answer(engine: ManagedProcess) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "response_format": {"type": "text"}, "max_tokens": 4}
    reply = http("POST", f"{engine.url}/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"]  # type: ignore[index]
