"""The rest of the OpenAI surface on the simulated engine: n > 1, logprobs, embeddings, responses.

The sim runner's logprobs and embeddings are fake (it is a cost model), so these tests check
shapes, counts and cache sharing; the real model's values are checked in test_engine_api_real.py.
"""

import base64
import json
import math
import struct
import uuid
from collections.abc import Iterator

import openai
import pytest

from engine.sim.sim_runner import SIM_EMBEDDING_DIM, SIM_TOKEN_LOGPROB
from tests.engine.test_server_sim import FAST_SIM, MODEL, post, wait_idle
from tests.procs import ManagedProcess, start_engine

BLOCK = 16


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    process = start_engine(
        tmp_path_factory.mktemp("sim-api"), *FAST_SIM, "--num-blocks", "400", "--max-model-len", "2048"
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(engine: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)


def long_prompt() -> list[int]:
    """A fresh 100-token prompt (six full blocks and a partial one)."""
    start = uuid.uuid4().int % 30000 + 100
    return [start + i for i in range(100)]


def test_n_samples_count_the_prompt_once_and_share_its_blocks(engine: ManagedProcess, client: openai.OpenAI) -> None:
    prompt = long_prompt()
    result = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, n=3, temperature=0)
    assert sorted(choice.index for choice in result.choices) == [0, 1, 2]
    assert all(choice.finish_reason == "length" and choice.text for choice in result.choices)
    assert result.usage.prompt_tokens == 100 and result.usage.completion_tokens == 15
    assert result.usage.prompt_tokens_details.cached_tokens == 96, "samples 2 and 3 reuse the 6 full prompt blocks"
    wait_idle(engine)


def test_streamed_chat_with_n_sends_every_choice_and_one_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me about birds."}],
            max_tokens=4,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = {0: "", 1: ""}
    finishes = {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert all(texts.values()) and finishes == {0: "length", 1: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_chat_logprobs_name_each_token_with_its_alternatives(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
    )
    content = result.choices[0].logprobs.content
    assert len(content) == 4 and "".join(entry.token for entry in content) == result.choices[0].message.content
    for entry in content:
        assert entry.logprob == SIM_TOKEN_LOGPROB and bytes(entry.bytes).decode() == entry.token
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token


def test_streamed_completion_logprobs_follow_the_text(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="Once", max_tokens=5, logprobs=1, stream=True))
    tokens: list[str] = []
    offsets: list[int] = []
    for chunk in chunks:
        tokens += chunk.choices[0].logprobs.tokens
        offsets += chunk.choices[0].logprobs.text_offset
        assert all(len(top) == 1 for top in chunk.choices[0].logprobs.top_logprobs)
    text = "".join(chunk.choices[0].text for chunk in chunks)
    assert "".join(tokens) == text and len(tokens) == 5
    assert offsets == [sum(len(token) for token in tokens[:i]) for i in range(5)]


def test_logprobs_are_absent_unless_asked(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert result.choices[0].logprobs is None


def test_embeddings_are_unit_vectors_per_input_as_floats_or_base64(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model=MODEL, input=["a red fox", "a blue bird", "a red fox"])
    vectors = [item.embedding for item in result.data]
    assert [item.index for item in result.data] == [0, 1, 2] and len(vectors[0]) == SIM_EMBEDDING_DIM
    assert all(math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-6) for vector in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert result.usage.prompt_tokens == result.usage.total_tokens > 3
    raw = client.embeddings.with_raw_response.create(model=MODEL, input="a red fox", encoding_format="base64")
    encoded = json.loads(raw.text)["data"][0]["embedding"]
    decoded = struct.unpack(f"<{SIM_EMBEDDING_DIM}f", base64.b64decode(encoded))
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(decoded, vectors[0], strict=True))


def test_responses_plain_and_streamed_agree(client: openai.OpenAI) -> None:
    whole = client.responses.create(
        model=MODEL, instructions="Be brief.", input="Tell me about birds.", max_output_tokens=6, temperature=0
    )
    assert whole.object == "response" and whole.status == "incomplete" and whole.output_text
    assert whole.usage.output_tokens == 6 and whole.usage.input_tokens > 5
    events = list(
        client.responses.create(
            model=MODEL,
            instructions="Be brief.",
            input=[{"role": "user", "content": "Tell me about birds."}],
            max_output_tokens=6,
            temperature=0,
            stream=True,
        )
    )
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-1] == "response.incomplete" and "response.output_text.done" in types
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert [event.sequence_number for event in events] == list(range(len(events)))


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/responses", {"input": "hi", "previous_response_id": "resp_1"}, 400, "previous_response_id"),
        ("/v1/responses", {"input": [{"type": "function_call", "name": "f"}]}, 400, "input"),
        ("/v1/responses", {"input": ""}, 400, "input"),
        ("/v1/embeddings", {"input": []}, 400, "input"),
        ("/v1/embeddings", {"input": "x", "dimensions": 3}, 400, "dimensions"),
        ("/v1/embeddings", {"input": "x", "model": "smollm2-135m:my-lora"}, 404, "model"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"apple": 5}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"10": 500}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
        ("/v1/completions", {"prompt": "hi", "n": 129}, 400, "n"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 30},
            400,
            "top_logprobs",
        ),
    ],
)
def test_bad_requests_on_the_new_endpoints_get_openai_errors(
    engine: ManagedProcess, path: str, body: dict, status: int, param: str
) -> None:
    code, error = post(f"{engine.url}{path}", json.dumps(body).encode())
    assert code == status and error["error"]["param"].startswith(param) and error["error"]["message"]
