"""vLLM's tokenizer endpoints and ``GET /v1/models/{id}`` at the gateway and at a bundled engine,
real processes on loopback: the gateway answers with its routing tokenizer, on the normalized text."""

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from normalize.chat_tokenizer import ChatTokenizer
from normalize.config import NormalizeConfig
from normalize.normalizer import Normalizer
from tests.gateway_cluster import INSTANT_SIM, MODEL, gateway_config, gateway_for, running, start_engine_set
from tests.procs import ManagedProcess, free_port

pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant.\r\nAnswer briefly.   "},
    {"role": "user", "content": "What is the capital of France?"},
]
MAX_CONTENT_CHARS = 2000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagedProcess, ManagedProcess]]:
    tmp_path: Path = tmp_path_factory.mktemp("tokenize")
    with running(start_engine_set(tmp_path, [(*INSTANT_SIM, "--max-model-len", "4096")])) as engines:
        config = gateway_config(free_port(), engines, limits={"max_content_chars": MAX_CONTENT_CHARS})
        with gateway_for(tmp_path, config) as gateway:
            _wait_for_context_length(gateway)
            yield gateway, engines[0]


def _wait_for_context_length(gateway: ManagedProcess) -> None:
    """Until the gateway has read the engine's /v1/models (its health checks do)."""
    deadline = time.monotonic() + 30
    while httpx.get(f"{gateway.url}/v1/models").json()["data"][0]["max_model_len"] is None:
        assert time.monotonic() < deadline, "the gateway never learned the engine's max_model_len"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return ChatTokenizer.load(MODEL)


def post(process: ManagedProcess, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{process.url}{path}", json=body, timeout=30)


def test_tokenize_a_prompt_equals_the_engine_and_the_tokenizer(
    cluster: tuple[ManagedProcess, ManagedProcess], tokenizer: ChatTokenizer
) -> None:
    gateway, engine = cluster
    body = {"model": MODEL, "prompt": "Hello world, how are you?", "return_token_strs": True}
    at_gateway, at_engine = post(gateway, "/tokenize", body), post(engine, "/tokenize", body)
    assert at_gateway.status_code == at_engine.status_code == 200
    assert at_gateway.headers["x-kvgate-normalized"] == "false"
    assert at_gateway.json() == at_engine.json()
    expected = tokenizer.encode_text(body["prompt"], add_special_tokens=True)
    assert at_gateway.json() == {
        "count": len(expected),
        "max_model_len": 4096,
        "tokens": expected,
        "token_strs": [tokenizer.tokenizer.id_to_token(token_id) for token_id in expected],
    }


def test_tokenize_messages_uses_the_normalized_text_and_says_so(
    cluster: tuple[ManagedProcess, ManagedProcess], tokenizer: ChatTokenizer
) -> None:
    gateway, engine = cluster
    body = {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": True}
    at_gateway = post(gateway, "/tokenize", body)
    assert at_gateway.status_code == 200
    assert at_gateway.headers["x-kvgate-normalized"] == "true"
    normalized = Normalizer(NormalizeConfig()).apply({"messages": MESSAGES}).body["messages"]
    assert at_gateway.json()["tokens"] == tokenizer.encode_text(tokenizer.render_chat(normalized))
    assert post(engine, "/tokenize", {**body, "messages": normalized}).json() == at_gateway.json()
    raw = post(engine, "/tokenize", body).json()
    assert raw["tokens"] != at_gateway.json()["tokens"]
    without_prompt = post(gateway, "/tokenize", {**body, "add_generation_prompt": False}).json()
    assert without_prompt["count"] < at_gateway.json()["count"]


def test_detokenize_and_tokenizer_info_match_the_engine(
    cluster: tuple[ManagedProcess, ManagedProcess], tokenizer: ChatTokenizer
) -> None:
    gateway, engine = cluster
    tokens = tokenizer.encode_text("The capital of France is Paris.")
    for process in cluster:
        assert post(process, "/detokenize", {"tokens": tokens}).json() == {"prompt": "The capital of France is Paris."}
    info = httpx.get(f"{gateway.url}/tokenizer_info").json()
    assert info == httpx.get(f"{engine.url}/tokenizer_info").json()
    assert info["eos_token"] == tokenizer.special_tokens["eos_token"]
    assert info["chat_template"] == tokenizer.chat_template
    assert info["tokenizer_class"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": "hi", "chat_template": "{{ x }}"}, "chat_template"),
        ("/tokenize", {"prompt": 12}, "prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/tokenize", {"model": "no-such-model", "prompt": "hi"}, "model"),
    ],
)
def test_bad_requests_get_an_openai_400_naming_the_field(
    cluster: tuple[ManagedProcess, ManagedProcess], path: str, body: dict[str, Any], param: str
) -> None:
    for process in cluster:
        response = post(process, path, body)
        assert response.status_code in (400, 404), response.text
        assert response.json()["error"]["param"] == param
    assert "x-request-id" in post(cluster[0], path, body).headers


def test_the_gateway_applies_its_input_limits(cluster: tuple[ManagedProcess, ManagedProcess]) -> None:
    gateway, engine = cluster
    long_prompt = "word " * MAX_CONTENT_CHARS
    refused = post(gateway, "/tokenize", {"prompt": long_prompt})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"
    assert post(engine, "/tokenize", {"prompt": long_prompt}).status_code == 200


def test_retrieve_a_model_at_gateway_and_engine(cluster: tuple[ManagedProcess, ManagedProcess]) -> None:
    gateway, engine = cluster
    for process in cluster:
        client = openai.OpenAI(base_url=f"{process.url}/v1", api_key="unused", max_retries=0)
        model = client.models.retrieve(MODEL)
        assert model.id == MODEL and model.created > 0
        assert model.model_extra["max_model_len"] == 4096
        assert model.model_extra["root"]
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("no-such-model")
        assert missing.value.body["code"] == "model_not_found"
    listed = httpx.get(f"{gateway.url}/v1/models").json()["data"][0]
    assert listed == httpx.get(f"{gateway.url}/v1/models/{MODEL}").json()
    assert listed["root"] == MODEL
    time.sleep(1.1)
    assert httpx.get(f"{gateway.url}/v1/models").json()["data"][0]["created"] == listed["created"]
