"""The whole OpenAI surface through a real gateway, driven by the official `openai` SDK.

Behind the gateway: two simulated engines (one declares a LoRA adapter it cannot serve) and a
stand-in hosted provider that needs an API key (tests/gateway/remote_provider.py), all real
processes on loopback.
"""

import json
import os
import secrets
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.harness.processes import module_command
from tests.gateway_cluster import MODEL, gateway_config, gateway_for, logged_lines, running, start_engines
from tests.procs import ManagedProcess, free_port, http, start

FAST_SIM = ("--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.002", "--max-model-len", "2048")
REMOTE_KEY = f"sk-remote-{secrets.token_hex(8)}"
WRONG_KEY = f"sk-wrong-{secrets.token_hex(8)}"
TRACE_ID = secrets.token_hex(16)
CALLER_SPAN = secrets.token_hex(8)


class Deployment:
    def __init__(self, gateway: ManagedProcess, request_log: Path) -> None:
        self.gateway = gateway
        self.request_log = request_log
        self.client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.request_log.read_text().splitlines() if line.strip()]

    def logged(self, matches: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        return logged_lines(self.request_log.read_text, matches)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp_path = tmp_path_factory.mktemp("surface")
    os.environ["KVGATE_TEST_REMOTE_KEY"] = REMOTE_KEY
    os.environ["KVGATE_TEST_WRONG_KEY"] = WRONG_KEY
    os.environ["REMOTE_PROVIDER_KEY"] = REMOTE_KEY
    provider_port = free_port()
    provider = start(
        module_command("tests.gateway.remote_provider", str(provider_port)),
        provider_port,
        tmp_path / "provider.log",
    )
    request_log = tmp_path / "requests.log"
    with running([provider, *start_engines(tmp_path, 2, *FAST_SIM)]) as (_, *engines):
        config = gateway_config(free_port(), engines, observability={"request_log_path": str(request_log)})
        config["backends"][0]["adapters"] = ["tuned-lora"]
        remote = {"url": provider.url, "tokenizer": "approximate", "headers": {"x-extra": "1"}}
        config["backends"] += [
            {**remote, "name": "remote", "model": "remote-model", "api_key_env": "KVGATE_TEST_REMOTE_KEY"},
            {**remote, "name": "remote-bad", "model": "remote-bad-model", "api_key": "env:KVGATE_TEST_WRONG_KEY"},
        ]
        config["model_aliases"] = {"gpt-4o-mini": MODEL, "sql": "sql-lora"}
        with gateway_for(tmp_path, config) as gateway:
            yield Deployment(gateway, request_log)


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
        "metadata": {"purpose": "test"},
        "extra_body": {"a_field_kvgate_does_not_know": {"kept": True}},
    }
    whole = deployment.client.chat.completions.create(**options)
    assert sorted(choice.index for choice in whole.choices) == [0, 1, 2]
    assert all(len(choice.logprobs.content) == 6 for choice in whole.choices)
    assert whole.usage.completion_tokens == 18
    chunks = list(
        deployment.client.chat.completions.create(**options, stream=True, stream_options={"include_usage": True})
    )
    assert {choice.index for chunk in chunks for choice in chunk.choices} == {0, 1, 2}
    assert chunks[-1].usage.completion_tokens == 18 and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_with_n_and_logprobs(deployment: Deployment) -> None:
    result = deployment.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, n=3, logprobs=2)
    assert len(result.choices) == 3 and all(len(choice.logprobs.tokens) == 4 for choice in result.choices)
    assert result.usage.completion_tokens == 12


def test_unknown_models_and_bad_fields_are_openai_errors(deployment: Deployment) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        deployment.client.chat.completions.create(model="gpt-nothing", messages=[{"role": "user", "content": "x"}])
    assert unknown.value.body["code"] == "model_not_found"
    for field, value in (("top_logprobs", 30), ("presence_penalty", 9), ("n", 0), ("logit_bias", {"1": 1000})):
        with pytest.raises(openai.BadRequestError) as bad:
            deployment.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], extra_body={field: value}
            )
        assert bad.value.body["param"].startswith(field)


def test_embeddings_are_routed_with_caps_and_tenants(deployment: Deployment) -> None:
    raw = deployment.client.embeddings.with_raw_response.create(model=MODEL, input=["a red fox", "a blue bird"])
    result = raw.parse()
    assert [item.index for item in result.data] == [0, 1] and result.usage.prompt_tokens > 4
    assert raw.headers["x-kvgate-backend"] in {"e0", "e1"}
    too_long = http("POST", f"{deployment.gateway.url}/v1/embeddings", {"model": MODEL, "input": "word " * 3000})
    assert too_long.status == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"


def test_responses_plain_and_streamed(deployment: Deployment) -> None:
    whole = deployment.client.responses.create(
        model=MODEL, instructions="Be brief.", input="Tell me about birds.", max_output_tokens=5, temperature=0
    )
    assert whole.output_text and whole.usage.output_tokens == 5
    events = list(
        deployment.client.responses.create(
            model=MODEL, instructions="Be brief.", input="Tell me about birds.", max_output_tokens=5, stream=True
        )
    )
    assert events[0].type == "response.created" and events[-1].response.usage.output_tokens == 5
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == whole.output_text
    logged = deployment.logged(lambda line: line["stream"] and line["completion_tokens"] == 5)
    assert logged and logged[-1]["status"] == "200", "the gateway read the usage of the Responses stream"
    refused = http(
        "POST",
        f"{deployment.gateway.url}/v1/responses",
        {"model": MODEL, "input": "hi", "previous_response_id": "resp_123"},
    )
    assert refused.status == 400 and refused.json()["error"]["param"] == "previous_response_id"


def test_models_lists_models_adapters_and_aliases(deployment: Deployment) -> None:
    models = {model.id: model for model in deployment.client.models.list().data}
    assert {MODEL, "remote-model", "remote-bad-model", "tuned-lora", "sql-lora", "gpt-4o-mini", "sql"} <= set(models)
    assert models["sql-lora"].parent == "remote-model" and models["tuned-lora"].parent == MODEL
    aliased = deployment.client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert aliased.headers["x-kvgate-backend"] in {"e0", "e1"} and aliased.parse().model == MODEL


def test_adapters_go_only_to_replicas_that_have_them(deployment: Deployment) -> None:
    for _ in range(3):
        routed = deployment.client.chat.completions.with_raw_response.create(
            model="sql", messages=[{"role": "user", "content": "SELECT"}], max_tokens=2
        )
        assert routed.headers["x-kvgate-backend"] == "remote"
        assert json.loads(routed.parse().choices[0].message.content)["model"] == "sql-lora"
    body = {"model": "tuned-lora", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for _ in range(3):
        refused = http("POST", f"{deployment.gateway.url}/v1/chat/completions", body)
        assert refused.headers["x-kvgate-backend"] == "e0", "only e0 declares tuned-lora"
        error = refused.json()["error"]
        assert refused.status == 404 and error["code"] == "model_not_found" and "no LoRA adapters" in error["message"]
    unknown = http("POST", f"{deployment.gateway.url}/v1/chat/completions", {**body, "model": "no-such-lora"})
    assert unknown.status == 404 and unknown.json()["error"]["param"] == "model"


def test_remote_upstream_gets_its_key_and_never_leaks_it(deployment: Deployment) -> None:
    traceparent = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
    reply = deployment.client.chat.completions.create(
        model="remote-model",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_headers={"traceparent": traceparent},
    )
    seen = json.loads(reply.choices[0].message.content)
    assert seen["x_extra"] == "1" and seen["model"] == "remote-model"
    _, trace_id, parent, flags = seen["traceparent"].split("-")
    assert trace_id == TRACE_ID and parent != CALLER_SPAN and flags == "01", "the gateway continues the trace"
    refused = http(
        "POST",
        f"{deployment.gateway.url}/v1/chat/completions",
        {"model": "remote-bad-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert refused.status == 401 and "[redacted]" in refused.json()["error"]["message"]
    with urllib.request.urlopen(f"{deployment.gateway.url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    admin = http("GET", f"{deployment.gateway.url}/admin/backends").body.decode()
    for text in (refused.body.decode(), metrics, admin, deployment.gateway.log(), deployment.request_log.read_text()):
        assert REMOTE_KEY not in text and WRONG_KEY not in text
    assert deployment.logged(lambda line: line["trace_id"] == TRACE_ID)


def test_a_streamed_request_carries_the_callers_trace_to_the_backend(deployment: Deployment) -> None:
    trace_id = secrets.token_hex(16)
    stream = deployment.client.chat.completions.create(
        model="remote-model",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        stream=True,
        extra_headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01", "tracestate": "vendor=1"},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert json.loads(text)["traceparent"].split("-")[1] == trace_id
    assert deployment.logged(lambda line: line["trace_id"] == trace_id and line["stream"])
