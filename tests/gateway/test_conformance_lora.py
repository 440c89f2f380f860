"""LoRA adapters through the gateway to bundled engines, driven by the official `openai` SDK.

Two engines, each serving its own adapter: e0 the real SmolLM2 with ``sql-lora`` (a PEFT
adapter made by the test), e1 a simulated engine with ``chat-lora`` (it reads only the adapter's
config). Both publish KV events; the gateway learns the adapters from their /v1/models, sends
each adapter's requests only to its replica and predicts an adapter prompt's cached tokens
exactly (precise mode).
"""

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from tests.gateway_cluster import MODEL, gateway_config, gateway_for, running
from tests.lora_adapter import make_lora_adapter
from tests.procs import ManagedProcess, free_port, http, start_engine

pytestmark = pytest.mark.slow

REAL = ("--num-blocks", "256", "--max-model-len", "1024", "--threads", "1")
SIM = ("--sim", "--sim-preset", "instant", "--max-model-len", "1024")
PROMPT = "List three uses of a SQL index, briefly, for a database course taught to first-year students."


class Deployment:
    def __init__(self, gateway: ManagedProcess, engines: list[ManagedProcess]) -> None:
        self.gateway = gateway
        self.engines = engines
        self.client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp_path = tmp_path_factory.mktemp("lora")
    sql = make_lora_adapter(tmp_path / "sql-lora", seed=3)
    chat = make_lora_adapter(tmp_path / "chat-lora", seed=4, rank=4, target_modules=("q_proj", "v_proj"))
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    flags = [
        (*REAL, "--lora-modules", f"sql-lora={sql}", "--kv-events", endpoints[0]),
        (*SIM, "--enable-lora", "--lora-modules", f"chat-lora={chat}", "--kv-events", endpoints[1]),
    ]
    with ThreadPoolExecutor(2) as pool:
        engines = list(pool.map(lambda i: start_engine(tmp_path, *flags[i], name=f"engine{i}"), range(2)))
    with running(engines):
        config = gateway_config(free_port(), engines, routing={"policy": "cache_aware"})
        for backend, endpoint in zip(config["backends"], endpoints, strict=True):
            backend["kv_events"] = endpoint
        with gateway_for(tmp_path, config) as gateway:
            deployment = Deployment(gateway, engines)
            wait_for_adapters(deployment)
            yield deployment


def wait_for_adapters(deployment: Deployment) -> None:
    """The gateway reads a replica's adapters from its /v1/models once the replica turns healthy."""
    deadline = time.monotonic() + 30
    while not {"sql-lora", "chat-lora"} <= {model.id for model in deployment.client.models.list().data}:
        assert time.monotonic() < deadline, "the gateway never listed the engines' adapters"
        time.sleep(0.1)


def ingest_counters(deployment: Deployment, backend: str) -> dict[str, Any]:
    reply = http("GET", f"{deployment.gateway.url}/dashboard/stats.json")
    assert reply.status == 200, reply.body
    stats: Any = reply.json()
    return stats["prefix_index"]["index"]["kv_events"][backend]


def test_engine_lists_its_adapters_as_vllm_does(deployment: Deployment) -> None:
    models: Any = http("GET", f"{deployment.engines[0].url}/v1/models").json()
    base, adapter = models["data"]
    assert base["id"] == MODEL and base["parent"] is None
    assert adapter["id"] == "sql-lora" and adapter["parent"] == MODEL and adapter["object"] == "model"
    assert adapter["root"].endswith("sql-lora")
    listed: dict[str, Any] = {model.id: model for model in deployment.client.models.list().data}
    assert listed["sql-lora"].parent == MODEL and listed["chat-lora"].parent == MODEL


def test_chat_and_completions_with_an_adapter_reach_only_its_replica(deployment: Deployment) -> None:
    client = deployment.client
    for _ in range(3):
        chat = client.chat.completions.with_raw_response.create(
            model="sql-lora", messages=[{"role": "user", "content": "SELECT"}], max_tokens=4, temperature=0
        )
        answer: Any = chat.parse()
        assert chat.headers["x-kvgate-backend"] == "e0"
        assert answer.model == "sql-lora" and answer.usage.completion_tokens == 4
        completion = client.completions.with_raw_response.create(model="chat-lora", prompt="Hello there", max_tokens=3)
        text: Any = completion.parse()
        assert completion.headers["x-kvgate-backend"] == "e1"
        assert text.model == "chat-lora" and text.usage.completion_tokens == 3
    streamed: list[Any] = list(
        client.completions.create(
            model="sql-lora", prompt="SELECT", max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    assert streamed[-1].usage.completion_tokens == 4 and streamed[0].model == "sql-lora"
    response = client.responses.with_raw_response.create(model="sql-lora", input="SELECT", max_output_tokens=3)
    assert response.headers["x-kvgate-backend"] == "e0" and response.parse().model == "sql-lora"


def test_embeddings_under_an_adapter_come_from_the_adapted_model(deployment: Deployment) -> None:
    client = deployment.client
    adapted = client.embeddings.with_raw_response.create(model="sql-lora", input="a red fox")
    assert adapted.headers["x-kvgate-backend"] == "e0" and adapted.parse().model == "sql-lora"
    base: Any = http("POST", f"{deployment.engines[0].url}/v1/embeddings", {"model": MODEL, "input": "a red fox"})
    assert adapted.parse().data[0].embedding != base.json()["data"][0]["embedding"]


def test_an_adapter_prompt_is_predicted_exactly_and_never_hits_base_blocks(deployment: Deployment) -> None:
    """Precise mode: the engine names the adapter in its KV events; the gateway's predicted cached
    tokens for the adapter's prompt equal what the engine reports. The same prompt's base-model
    blocks, cached on e0 first, are no hit for the adapter."""
    follow_events(deployment, "e0")
    messages: Any = [{"role": "user", "content": PROMPT}]
    base_body = {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0}
    base: Any = stored_after(
        deployment, lambda: http("POST", f"{deployment.engines[0].url}/v1/chat/completions", base_body).json()
    )

    def adapter_request() -> Any:
        return deployment.client.chat.completions.with_raw_response.create(
            model="sql-lora", messages=messages, max_tokens=2, temperature=0
        )

    outcomes = []
    for reply in (stored_after(deployment, adapter_request), adapter_request()):
        usage = reply.parse().usage
        predicted = int(reply.headers["x-kvgate-predicted-cached-tokens"])
        outcomes.append((reply.headers["x-kvgate-backend"], predicted, usage.prompt_tokens_details.cached_tokens))
    assert base["usage"]["prompt_tokens"] == usage.prompt_tokens >= 32
    assert [backend for backend, *_ in outcomes] == ["e0", "e0"]
    (_, first_predicted, first_cached), (_, second_predicted, second_cached) = outcomes
    assert first_predicted == first_cached == 0, "base blocks of the same prompt are not the adapter's"
    assert second_predicted == second_cached >= 32


def stored_after(deployment: Deployment, send: Callable[[], Any]) -> Any:
    """``send()``'s result, once the gateway has ingested the blocks it stored on e0 (the prefill
    of a short prompt is one step, so all its blocks come in one event)."""
    before = ingest_counters(deployment, "e0")["ingest"]["blocks_stored"]
    result = send()
    deadline = time.monotonic() + 10
    while ingest_counters(deployment, "e0")["ingest"]["blocks_stored"] == before:
        assert time.monotonic() < deadline, "the gateway never received e0's stored blocks"
        time.sleep(0.02)
    return result


def follow_events(deployment: Deployment, backend: str) -> None:
    """Reset the engine's cache until the gateway receives its events (ZMQ's slow joiner)."""
    index = int(backend[1:])
    before = ingest_counters(deployment, backend)["received"]
    deadline = time.monotonic() + 20
    while ingest_counters(deployment, backend)["received"] == before:
        assert time.monotonic() < deadline, f"the gateway never received {backend}'s KV events"
        http("POST", f"{deployment.engines[index].url}/reset_prefix_cache")
        time.sleep(0.05)


def test_an_adapter_no_replica_serves_is_an_openai_404(deployment: Deployment) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        deployment.client.chat.completions.create(
            model="sql-lora-v2", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    body: Any = missing.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    direct = http(
        "POST",
        f"{deployment.engines[1].url}/v1/chat/completions",
        {"model": "sql-lora", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
    )
    error: Any = direct.json()
    assert direct.status == 404 and error["error"]["code"] == "model_not_found"
    assert "'chat-lora'" in error["error"]["message"]
