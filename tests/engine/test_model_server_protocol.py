"""GIE's Model Server Protocol on a real ``kvgate engine --sim``: the metrics an endpoint picker scrapes
(gateway-api-inference-extension ``docs/proposals/003-model-server-protocol``), under vLLM's names,
types and labels (``vllm/v1/metrics/loggers.py``), and true to the scheduler while streams are held open."""

import http.client
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.procs import ManagedProcess, start_engine

MODEL = "gie-model"
BLOCK_SIZE = 32
NUM_BLOCKS = 96
MAX_NUM_SEQS = 2
PROMPT_TOKENS = 200
"""Seven blocks per prompt: two running sequences hold a visible share of the pool."""
VLLM_LABELS = {"model_name": MODEL, "engine": "0"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    folder = tmp_path_factory.mktemp("msp")
    adapters = [f"{name}={write_adapter_config(folder / name)}" for name in ("sql", "poet")]
    process = start_engine(
        folder,
        "--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.05", "--check-invariants",
        "--served-model-name", MODEL,
        "--block-size", str(BLOCK_SIZE),
        "--num-blocks", str(NUM_BLOCKS),
        "--max-num-seqs", str(MAX_NUM_SEQS),
        "--max-model-len", str(BLOCK_SIZE * NUM_BLOCKS),
        "--lora-modules", *adapters,
        "--max-loras", "1",
    )  # fmt: skip
    yield process
    process.stop()


def write_adapter_config(folder: Path) -> Path:
    """A PEFT LoRA config: all the simulated engine reads of an adapter."""
    folder.mkdir()
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def scrape(engine: ManagedProcess) -> dict[str, tuple[str, list[Sample]]]:
    """Each metric family of the engine's /metrics, parsed by prometheus_client: name -> (type, samples)."""
    with urllib.request.urlopen(f"{engine.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: (family.type, family.samples) for family in text_string_to_metric_families(text)}


def only_sample(families: dict[str, tuple[str, list[Sample]]], name: str, kind: str = "gauge") -> Sample:
    assert name in families, f"{name} not in /metrics"
    family_type, samples = families[name]
    assert family_type == kind, f"{name} is a {family_type}, not a {kind}"
    (sample,) = samples
    return sample


def state(engine: ManagedProcess) -> tuple[float, float, float]:
    """(running, waiting, KV usage) as the engine exports them."""
    families = scrape(engine)
    running, waiting, usage = (
        only_sample(families, name)
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    )
    return running.value, waiting.value, usage.value


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def open_stream(engine: ManagedProcess, stack: ExitStack, seed: int, model: str = MODEL) -> None:
    """Start a long streamed completion and keep it open (its first event read) until ``stack`` closes."""
    port = int(engine.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    stack.callback(connection.close)
    body = {"model": model, "prompt": [1000 + seed] * PROMPT_TOKENS, "max_tokens": 800, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200, response.read()


def test_the_protocol_metrics_have_vllms_names_types_and_labels(engine: ManagedProcess) -> None:
    families = scrape(engine)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert only_sample(families, name).labels == VLLM_LABELS
    info = only_sample(families, "vllm:cache_config_info")
    assert info.value == 1.0
    assert info.labels["block_size"] == str(BLOCK_SIZE) and info.labels["num_gpu_blocks"] == str(NUM_BLOCKS)
    assert info.labels["engine"] == "0" and "model_name" not in info.labels
    lora = only_sample(families, "vllm:lora_requests_info")
    assert set(lora.labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert lora.labels["max_lora"] == "1"
    assert abs(lora.value - time.time()) < 60, "the value is the time of the reading, as vLLM sets it"
    queries = only_sample(families, "vllm:prefix_cache_queries", kind="counter")
    assert queries.name == "vllm:prefix_cache_queries_total" and queries.labels == VLLM_LABELS
    _, success = families["vllm:request_success"]
    assert {sample.labels["finished_reason"] for sample in success} == {"stop", "length", "abort"}


def test_running_waiting_and_kv_usage_follow_held_streams(engine: ManagedProcess) -> None:
    assert state(engine) == (0.0, 0.0, 0.0)
    with ExitStack() as streams:
        for seed in range(MAX_NUM_SEQS + 2):
            open_stream(engine, streams, seed)
        wait_for(lambda: state(engine)[:2] == (MAX_NUM_SEQS, 2), "two running and two waiting")
        running, waiting, usage = state(engine)
        blocks_held = MAX_NUM_SEQS * -(-PROMPT_TOKENS // BLOCK_SIZE)
        assert blocks_held / NUM_BLOCKS <= usage < 1.0
    wait_for(lambda: state(engine) == (0.0, 0.0, 0.0), "closed streams to free everything")


def test_lora_requests_info_names_running_and_waiting_adapters(engine: ManagedProcess) -> None:
    def adapters() -> tuple[str, str]:
        labels = only_sample(scrape(engine), "vllm:lora_requests_info").labels
        return labels["running_lora_adapters"], labels["waiting_lora_adapters"]

    assert adapters() == ("", "")
    with ExitStack() as streams:
        open_stream(engine, streams, 10, model="sql")
        wait_for(lambda: adapters() == ("sql", ""), "sql running")
        open_stream(engine, streams, 11, model="poet")
        wait_for(lambda: adapters() == ("sql", "poet"), "poet waiting behind --max-loras 1")
    wait_for(lambda: adapters() == ("", ""), "no adapter in use")


def test_the_real_model_engine_exports_the_same_protocol(tmp_path: Path) -> None:
    """The same metrics from the torch model runner (the bundled SmolLM2), not only the simulator."""
    engine = start_engine(
        tmp_path, "--served-model-name", MODEL, "--block-size", "16", "--num-blocks", "256", "--max-model-len", "1024"
    )
    try:
        with ExitStack() as streams:
            open_stream(engine, streams, 0)
            wait_for(lambda: state(engine)[0] == 1.0 and state(engine)[2] > 0, "the stream to run and hold blocks")
        wait_for(lambda: state(engine) == (0.0, 0.0, 0.0), "the closed stream to free everything")
        families = scrape(engine)
        info = only_sample(families, "vllm:cache_config_info")
        assert (info.labels["block_size"], info.labels["num_gpu_blocks"]) == ("16", "256")
        assert only_sample(families, "vllm:num_requests_waiting").labels == VLLM_LABELS
        assert "vllm:lora_requests_info" not in families, "vLLM exports it only with LoRA enabled"
        aborted = [
            sample for sample in families["vllm:request_success"][1] if sample.labels["finished_reason"] == "abort"
        ]
        assert [sample.value for sample in aborted] == [1.0]
    finally:
        engine.stop()
