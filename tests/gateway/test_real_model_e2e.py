"""The walking skeleton end to end: an OpenAI client, the gateway, two engines running SmolLM2."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

from tests.procs import ManagedProcess, free_port, http, start_gateway

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, real_engines: list[ManagedProcess]
) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("real-model")
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": MODEL,
        "backends": [{"name": f"engine-{i}", "url": engine.url} for i, engine in enumerate(real_engines)],
        "routing": {"policy": "round_robin"},
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    gateway = start_gateway(tmp_path, config_path, port)
    yield gateway
    gateway.stop()


@pytest.fixture
def client(deployment: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{deployment.url}/v1", api_key="unused", max_retries=0)


def test_chat_answers_through_gateway_with_routing_headers(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0)
    completion = raw.parse()
    assert "Paris" in completion.choices[0].message.content
    assert raw.headers["x-kvgate-backend"] in {"engine-0", "engine-1"}
    assert raw.headers["x-request-id"]
    assert completion.usage.prompt_tokens > 0


def test_a_repeated_prompt_reports_its_cached_blocks(client: openai.OpenAI) -> None:
    """A new prompt is all computed; the same prompt again on the same replica reuses every full block
    but the last token's (the engine computes at least one token), and usage says so."""
    system = f"Session {uuid.uuid4().hex}. You answer questions about European geography in one word."
    messages = [{"role": "system", "content": system * 3}, *QUESTION]
    served: dict[str, list[tuple[int, int]]] = {}
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=2)
        usage = raw.parse().usage
        served.setdefault(raw.headers["x-kvgate-backend"], []).append(
            (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens)
        )
    assert all(replies[0][1] == 0 for replies in served.values()), served
    again = [reply for replies in served.values() for reply in replies[1:]]
    assert again, f"round robin over 2 replicas sends 2 of 3 requests to one: {served}"
    assert all(cached == (prompt - 1) // 16 * 16 > 0 for prompt, cached in again), served


def test_streaming_chat_passes_chunks_and_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 12
    assert len([chunk for chunk in chunks if chunk.choices]) > 2


def test_stream_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, stream=True))
    assert chunks and all(chunk.usage is None for chunk in chunks)


def test_completions_endpoint_streaming_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    streamed = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == whole.choices[0].text


def test_greedy_is_deterministic_and_both_replicas_serve(client: openai.OpenAI) -> None:
    backends, answers = set(), set()
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=QUESTION, max_tokens=10, temperature=0
        )
        backends.add(raw.headers["x-kvgate-backend"])
        answers.add(raw.parse().choices[0].message.content)
    assert backends == {"engine-0", "engine-1"}
    assert len(answers) == 1


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b'{"model": "smollm2-135m"}', 400, "messages"),
        (b'{"model": "smollm2-135m", "messages": "hello"}', 400, "messages"),
        (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": 5}]}', 400, "messages.0.content"),
        (
            b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
            400,
            "max_tokens",
        ),
        (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
        (b"[1, 2]", 400, None),
    ],
)
def test_bad_chat_input_gets_openai_error(
    deployment: ManagedProcess, body: bytes, status: int, param: str | None
) -> None:
    response = http("POST", f"{deployment.url}/v1/chat/completions", body)
    assert response.status == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"].startswith(param)


def test_bad_completion_prompt_and_unknown_route(deployment: ManagedProcess) -> None:
    missing = http("POST", f"{deployment.url}/v1/completions", {"model": MODEL})
    assert missing.status == 400 and missing.json()["error"]["param"] == "prompt"
    unknown = http("GET", f"{deployment.url}/v1/nothing-here")
    assert unknown.status == 404 and "error" in unknown.json()


def test_invalid_config_names_key_and_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: {port: nope}\nroutng: {}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway.process.cli", "gateway", "-c", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "listen.port" in result.stderr and "routng: unknown key" in result.stderr and str(bad) in result.stderr


def test_n_logprobs_and_embeddings_reach_the_real_model(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=4, n=2, temperature=0, logprobs=True, top_logprobs=1
    )
    first, second = sorted(chat.choices, key=lambda choice: choice.index)
    assert first.message.content == second.message.content, "greedy samples agree"
    for entry in first.logprobs.content:
        assert entry.logprob <= 0 and entry.top_logprobs[0].token == entry.token
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-6
    assert chat.usage.completion_tokens == 8
    assert chat.usage.prompt_tokens_details.cached_tokens == (chat.usage.prompt_tokens - 1) // 16 * 16
    vector = client.embeddings.create(model=MODEL, input="Paris is the capital of France.").data[0].embedding
    assert len(vector) == 576 and abs(sum(value * value for value in vector) - 1) < 1e-4
