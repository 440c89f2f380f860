"""The engine server end to end in simulated mode: real processes, loopback, the openai client."""

import json
import re
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import zmq

from radix.hashing import block_hashes
from radix.kv_event_format import AllBlocksCleared, BlockRemoved, BlockStored, parse_frames, wire_block_hash
from tests.procs import ManagedProcess, free_port, start_engine

MODEL = "smollm2-135m"
NUM_BLOCKS = 600
FAST_SIM = ("--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.002", "--check-invariants")
DECODE_STEP_S = 0.02
LONG_TOKENS = 2000
CANCEL_BOUND_S = DECODE_STEP_S * LONG_TOKENS / 2
"""A real abort frees everything in under 0.1 s; an engine that never aborts would decode the
LONG_TOKENS request for at least DECODE_STEP_S x LONG_TOKENS = 40 s however busy the machine
(the simulator's steps never take less), twice this bound."""


@pytest.fixture(scope="module")
def events_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, events_endpoint: str) -> Iterator[ManagedProcess]:
    process = start_engine(
        tmp_path_factory.mktemp("sim"),
        *FAST_SIM,
        "--num-blocks", str(NUM_BLOCKS),
        "--max-model-len", "4096",
        "--kv-events", events_endpoint,
    )  # fmt: skip
    yield process
    process.stop()


@pytest.fixture(scope="module")
def slow_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """An engine slow enough that a request it fails to abort is still running long after the bound."""
    process = start_engine(
        tmp_path_factory.mktemp("slow-sim"),
        "--sim", "--sim-preset", "instant", "--sim-decode-base-s", str(DECODE_STEP_S), "--check-invariants",
        "--max-model-len", "4096",
        name="slow",
    )  # fmt: skip
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(engine: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def metric(engine: ManagedProcess, name: str) -> float:
    with urllib.request.urlopen(f"{engine.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def wait_idle(engine: ManagedProcess, timeout: float = 10.0) -> dict[str, Any]:
    """Stats once nothing runs or waits and every block is free again."""
    deadline = time.monotonic() + timeout
    while True:
        stats = get_json(f"{engine.url}/stats")
        if stats["running"] == 0 and stats["waiting"] == 0 and stats["free_blocks"] == stats["num_blocks"]:
            return stats
        assert time.monotonic() < deadline, f"engine not idle: {stats}"
        time.sleep(0.05)


def test_completion_honours_max_tokens_exactly(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=23, temperature=0)
    assert result.usage.completion_tokens == 23
    assert result.choices[0].finish_reason == "length"
    assert result.choices[0].text.split()[:2] and result.object == "text_completion"


def test_stop_string_ends_the_completion_before_it(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL, prompt="Say something", max_tokens=40, stop=["fox"])
    assert result.choices[0].finish_reason == "stop"
    assert "fox" not in result.choices[0].text and result.usage.completion_tokens < 40


def test_streaming_chat_matches_non_streaming(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me about birds."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content and text.strip()
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"


def test_shared_prefix_hits_and_metrics_agree_with_usage(engine: ManagedProcess, client: openai.OpenAI) -> None:
    salt = uuid.uuid4().hex
    prefix = [(i * 37) % 40000 + 100 for i in range(1500)]
    hits_before = metric(engine, "vllm:prefix_cache_hits_total")
    queries_before = metric(engine, "vllm:prefix_cache_queries_total")
    cached = []
    prompt_tokens = 0
    for suffix in ([11, 12, 13], [21, 22, 23, 24], [31]):
        result = client.completions.create(
            model=MODEL, prompt=prefix + suffix, max_tokens=4, temperature=0, extra_body={"cache_salt": salt}
        )
        cached.append(result.usage.prompt_tokens_details.cached_tokens)
        prompt_tokens += result.usage.prompt_tokens
    assert cached[0] == 0
    assert min(cached[1:]) >= 1488
    assert metric(engine, "vllm:prefix_cache_hits_total") - hits_before == sum(cached)
    assert metric(engine, "vllm:prefix_cache_queries_total") - queries_before == prompt_tokens


def test_cache_salt_isolates_tenants(client: openai.OpenAI) -> None:
    prompt = [(i * 13) % 30000 + 50 for i in range(200)]
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, extra_body={"cache_salt": "tenant-a"})
    other = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, extra_body={"cache_salt": "tenant-b"})
    same = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, extra_body={"cache_salt": "tenant-a"})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert same.usage.prompt_tokens_details.cached_tokens == 192


def test_kv_events_decode_to_the_blocks_the_engine_holds(
    engine: ManagedProcess, client: openai.OpenAI, events_endpoint: str
) -> None:
    context = zmq.Context.instance()
    subscriber = context.socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.setsockopt(zmq.RCVTIMEO, 1000)
    subscriber.connect(events_endpoint)
    try:
        held: set[int | bytes] = set()
        cleared = False
        deadline = time.monotonic() + 20
        while not cleared:
            assert time.monotonic() < deadline, "no AllBlocksCleared event after /reset_prefix_cache"
            assert post(f"{engine.url}/reset_prefix_cache", b"")[0] == 200
            try:
                cleared = _apply(parse_frames(subscriber.recv_multipart())[1].events, held)
            except zmq.Again:
                continue
        salt = uuid.uuid4().hex
        prompt = list(range(1000, 1100))
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, extra_body={"cache_salt": salt})
        expected = {wire_block_hash(block_hash) for block_hash in block_hashes(prompt, 16, MODEL, salt)}
        stats = wait_idle(engine)
        while len(held) < stats["cached_blocks"]:
            _apply(parse_frames(subscriber.recv_multipart())[1].events, held)
        assert expected <= held
        assert len(held) == stats["cached_blocks"] == 7, "6 prompt blocks and 1 full block of prompt + output"
    finally:
        subscriber.close()


def _apply(events: list, held: set[int | bytes]) -> bool:
    """Track stored/removed hashes; True if the batch cleared everything."""
    cleared = False
    for event in events:
        if isinstance(event, AllBlocksCleared):
            held.clear()
            cleared = True
        elif isinstance(event, BlockStored):
            assert len(event.token_ids) == len(event.block_hashes) * event.block_size
            held.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            held.difference_update(event.block_hashes)
    return cleared


def test_mid_stream_disconnect_aborts_and_frees_everything(slow_engine: ManagedProcess) -> None:
    body = json.dumps({"model": MODEL, "prompt": "A long story:", "max_tokens": LONG_TOKENS, "stream": True}).encode()
    request = urllib.request.Request(
        f"{slow_engine.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    response = urllib.request.urlopen(request, timeout=10)
    lines = [response.readline() for _ in range(6)]
    assert lines[0].startswith(b"data: ")
    assert get_json(f"{slow_engine.url}/stats")["running"] == 1
    response.close()
    stats = wait_idle(slow_engine, timeout=CANCEL_BOUND_S)
    assert stats["kv_cache_usage"] == 0.0


def test_disconnect_while_waiting_for_a_whole_response_aborts_it(slow_engine: ManagedProcess) -> None:
    body = json.dumps({"model": MODEL, "prompt": "A long story:", "max_tokens": LONG_TOKENS}).encode()
    with socket.create_connection(("127.0.0.1", slow_engine.port), timeout=10) as connection:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        connection.sendall(head.encode() + body)
        deadline = time.monotonic() + 10
        while get_json(f"{slow_engine.url}/stats")["running"] == 0:
            assert time.monotonic() < deadline, "request never started"
            time.sleep(0.02)
    wait_idle(slow_engine, timeout=CANCEL_BOUND_S)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
        ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": []}, 400, "prompt"),
        ({"prompt": [1, 2, 10**9]}, 400, "prompt"),
        ({"prompt": "x " * 5000}, 400, "prompt"),
        ({"prompt": "hi", "max_tokens": 4096}, 400, "max_tokens"),
        ({"prompt": "hi", "n": 0}, 400, "n"),
        ({"max_tokens": 3}, 400, "prompt"),
        ({"prompt": "hi", "model": "no-such-model"}, 404, "model"),
    ],
)
def test_bad_completion_requests_get_openai_errors(engine: ManagedProcess, body: dict, status: int, param: str) -> None:
    code, error = post(f"{engine.url}/v1/completions", json.dumps(body).encode())
    assert code == status
    assert error["error"]["param"] == param and error["error"]["message"] and "type" in error["error"]


def test_bad_chat_requests_and_bodies_get_openai_errors(engine: ManagedProcess) -> None:
    for body in (b"{not json", b"[1, 2]", b'{"messages": []}', b'{"messages": [{"role": "user", "content": 5}]}'):
        code, error = post(f"{engine.url}/v1/chat/completions", body)
        assert code == 400 and set(error["error"]) == {"message", "type", "param", "code"}
    code, error = post(f"{engine.url}/v1/nowhere", b"{}")
    assert code == 404 and error["error"]["type"] == "not_found_error"


def test_the_load_reading_acknowledges_each_senders_latest_request_answered_or_refused(engine: ManagedProcess) -> None:
    origin = uuid.uuid4().hex[:16]
    url = f"{engine.url}/v1/completions"

    def sent(ordinal: str, body: dict) -> int:
        return post(url, json.dumps(body).encode(), {"x-kvgate-load-mark": f"{origin}:{ordinal}"})[0]

    def acknowledged() -> int | None:
        return get_json(f"{engine.url}/stats")["arrivals"].get(origin)

    assert acknowledged() is None
    assert sent("3", {"prompt": [5, 6, 7], "max_tokens": 2}) == 200
    assert acknowledged() == 3
    assert sent("9", {"prompt": [5, 6, 7], "max_tokens": 4096}) == 400
    assert acknowledged() == 9, "refused: it is in no reading, and its sender may stop counting it"
    assert sent("4", {"prompt": [5, 6, 7], "max_tokens": 2}) == 200
    assert sent("x10", {"prompt": [5, 6, 7], "max_tokens": 2}) == 200
    assert acknowledged() == 9, "an overtaken request leaves the latest; a malformed mark is none"


def test_models_health_and_cache_config(engine: ManagedProcess) -> None:
    models = get_json(f"{engine.url}/v1/models")
    assert [model["id"] for model in models["data"]] == [MODEL]
    assert get_json(f"{engine.url}/health")["status"] == "ok"
    assert metric(engine, "vllm:cache_config_info") == 1.0
    with urllib.request.urlopen(f"{engine.url}/metrics", timeout=10) as response:
        assert f'num_gpu_blocks="{NUM_BLOCKS}"' in response.read().decode()


def test_preemption_and_aborts_under_a_tiny_pool_leave_no_leak(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *FAST_SIM, "--num-blocks", "16", "--max-model-len", "128", name="tiny")
    try:
        client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)

        def complete(index: int) -> int:
            prompt = [100 + index] * 40
            return client.completions.create(model=MODEL, prompt=prompt, max_tokens=60).usage.completion_tokens

        def abandon(index: int) -> None:
            body = json.dumps({"prompt": [200 + index] * 30, "max_tokens": 90, "stream": True}).encode()
            request = urllib.request.Request(f"{engine.url}/v1/completions", data=body)
            with urllib.request.urlopen(request, timeout=30) as response:
                response.readline()

        with ThreadPoolExecutor(8) as pool:
            completed = pool.map(complete, range(6))
            list(pool.map(abandon, range(3)))
            assert list(completed) == [60] * 6
        stats = wait_idle(engine)
        assert stats["num_preemptions"] > 0
        assert metric(engine, "vllm:num_preemptions_total") == stats["num_preemptions"]
    finally:
        engine.stop()
    assert engine.proc.returncode == 0, engine.log()[-2000:]
