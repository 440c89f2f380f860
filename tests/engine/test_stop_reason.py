"""vLLM's ``stop_reason``: the stop string that ended a choice (null after EOS or at the token limit),
on the engine's chat and completions, whole and streamed, and through the gateway's Anthropic front end
as ``stop_reason: "stop_sequence"`` with the matched ``stop_sequence``."""

import json
from collections.abc import Iterator

import anthropic
import pytest

from tests.gateway_cluster import gateway_config, gateway_for
from tests.procs import ManagedProcess, free_port, http

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is Paris. The capital of Germany is"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, real_engines: list[ManagedProcess]
) -> Iterator[tuple[ManagedProcess, ManagedProcess]]:
    tmp_path = tmp_path_factory.mktemp("stop-reason")
    with gateway_for(tmp_path, gateway_config(free_port(), real_engines[:1])) as gateway:
        yield real_engines[0], gateway


def post(engine: ManagedProcess, path: str, body: dict) -> dict:
    reply = http("POST", f"{engine.url}{path}", {"model": MODEL, "temperature": 0, **body})
    assert reply.status == 200, reply.body
    return reply.json()  # type: ignore[return-value]


def streamed_choices(engine: ManagedProcess, path: str, body: dict) -> list[dict]:
    reply = http("POST", f"{engine.url}{path}", {"model": MODEL, "temperature": 0, "stream": True, **body})
    assert reply.status == 200, reply.body
    lines = [line.removeprefix("data: ") for line in reply.body.decode().split("\n") if line.startswith("data: ")]
    return [choice for line in lines if line != "[DONE]" for choice in json.loads(line)["choices"]]


def middle_word(text: str) -> str:
    """A word the greedy answer writes after its first token (so a stop on it ends the answer early)."""
    words = text.split()
    assert len(words) >= 3, text
    return " " + words[len(words) // 2]


@pytest.mark.parametrize(
    "path,prompt", [("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": QUESTION})]
)
def test_a_stop_string_is_the_stop_reason_and_eos_or_length_is_null(
    deployment: tuple[ManagedProcess, ManagedProcess], path: str, prompt: dict
) -> None:
    engine, _ = deployment
    free = post(engine, path, {**prompt, "max_tokens": 24})["choices"][0]
    assert free["stop_reason"] is None and free["finish_reason"] in ("stop", "length")
    text = free["text"] if "text" in free else free["message"]["content"]
    stop = middle_word(text)
    stopped = post(engine, path, {**prompt, "max_tokens": 24, "stop": ["never-appears", stop]})["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop
    cut = stopped["text"] if "text" in stopped else stopped["message"]["content"]
    assert text.startswith(cut) and stop not in cut

    chunks = streamed_choices(engine, path, {**prompt, "max_tokens": 24, "stop": [stop]})
    assert [c["stop_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["finish_reason"] == "stop" and chunks[-1]["stop_reason"] == stop


def test_anthropic_reports_the_matched_stop_sequence(deployment: tuple[ManagedProcess, ManagedProcess]) -> None:
    engine, gateway = deployment
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    text = post(engine, "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 24})["choices"][0]["message"]
    stop = middle_word(text["content"])
    greedy = {"temperature": 0}
    message = client.messages.create(
        model=MODEL, max_tokens=24, messages=QUESTION, stop_sequences=["never-appears", stop], extra_body=greedy
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert stop not in message.content[0].text
    events = list(
        client.messages.create(
            model=MODEL, max_tokens=24, messages=QUESTION, stop_sequences=[stop], extra_body=greedy, stream=True
        )
    )
    final = next(event for event in events if event.type == "message_delta")
    assert final.delta.stop_reason == "stop_sequence" and final.delta.stop_sequence == stop
