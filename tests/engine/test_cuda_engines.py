"""Real engines with ``--device cuda`` on loopback, for what the runner does on the GPU beyond the
forward pass: a prefill and a decode engine move a prompt's KV between their GPU pools (the
bundled connector reads and writes device blocks) with the decode leg's output equal to an
aggregated engine's; a JSON schema's token masks apply to GPU logits; seeded sampling with
penalties and logprobs runs there and repeats; a prefix evicted to the host tier (pinned memory)
comes back as cached tokens with the same greedy output. Runs wherever ``torch.cuda.is_available()``;
skipped (with the reason) elsewhere."""

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.engine.test_pd_engines import (
    BLOCK,
    CHAT,
    COMMON,
    MODEL,
    PROMPT,
    cached,
    connector,
    disaggregated,
    free_blocks,
    post,
    text_of,
)
from tests.procs import ManagedProcess, free_port, start_engines

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ManagedProcess]]:
    tmp = tmp_path_factory.mktemp("cuda-engines")
    cuda = (*COMMON, "--device", "cuda")
    host_tier = ("--threads", "1", "--device", "cuda", "--num-blocks", "40", "--host-kv-blocks", "64",
                 "--max-model-len", "512", "--check-invariants")  # fmt: skip
    starts = {
        "prefill": (*cuda, *connector(free_port())),
        "decode": (*cuda, *connector()),
        "aggregated": cuda,
        "host-tier": host_tier,
    }
    started = start_engines(tmp, starts)
    yield started
    for engine in started.values():
        engine.stop()


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": CHAT})]
)
def test_gpu_pools_hand_over_a_prefill_and_decode_equals_the_aggregated_engine(
    engines: dict[str, ManagedProcess], path: str, body: dict[str, Any]
) -> None:
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, **body}
    expected = post(engines["aggregated"], path, body)
    assert expected["usage"]["completion_tokens"] == 16
    _, decode = disaggregated(engines["prefill"], engines["decode"], path, body)
    full_blocks = (expected["usage"]["prompt_tokens"] - 1) // BLOCK
    assert text_of(decode) == text_of(expected)
    assert cached(decode) == full_blocks * BLOCK, "the pulled blocks count as cached"
    assert free_blocks(engines["prefill"]) == 200 and free_blocks(engines["decode"]) == 200


def test_a_json_schema_masks_gpu_logits_to_a_valid_instance(engines: dict[str, ManagedProcess]) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    }
    answer = post(engines["aggregated"], "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}},
    })  # fmt: skip
    assert answer["choices"][0]["finish_reason"] == "stop"
    instance = json.loads(text_of(answer))
    assert set(instance) == {"city", "unit"} and instance["unit"] in ("celsius", "fahrenheit")
    assert isinstance(instance["city"], str) and len(instance["city"]) <= 24


def test_seeded_sampling_with_penalties_and_logprobs_repeats_on_the_gpu(engines: dict[str, ManagedProcess]) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": 7,
            "frequency_penalty": 0.5, "presence_penalty": 0.3, "logprobs": 3}  # fmt: skip
    first, second = (post(engines["aggregated"], "/v1/completions", body) for _ in range(2))
    assert text_of(first) == text_of(second) and first["usage"]["completion_tokens"] == 12
    logprobs = first["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 12 and all(len(top) >= 1 for top in logprobs["top_logprobs"])
    assert all(value <= 0 for value in logprobs["token_logprobs"])


def test_a_prefix_evicted_to_pinned_host_memory_comes_back_cached_with_the_same_output(
    engines: dict[str, ManagedProcess],
) -> None:
    engine = engines["host-tier"]
    document = list(range(3000, 3200))
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    first = post(engine, "/v1/completions", {**body, "prompt": document})
    assert cached(first) == 0
    for offset in range(3):  # 3 x 13 blocks through a 40-block pool push the document out
        post(engine, "/v1/completions", {**body, "prompt": list(range(5000 + offset * 300, 5200 + offset * 300))})
    again = post(engine, "/v1/completions", {**body, "prompt": document})
    assert cached(again) == 192, "the document's 12 full blocks come back from the host tier"
    assert text_of(again) == text_of(first)
