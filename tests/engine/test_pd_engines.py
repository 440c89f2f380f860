"""Disaggregated prefill/decode between real SmolLM2 engines on loopback (--kv-transfer-config):
the decode leg's greedy output equals the aggregated engine's, usage counts pulled tokens as
cached, a follow-up pulls only what the decode engine lacks, both engines publish what they
hold, and a dead prefill engine costs only a local prefill."""

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import zmq

from normalize.chat_tokenizer import ChatTokenizer
from protocol.replica_stats import decode_stats
from radix.hashing import block_hashes, hash_to_bytes
from radix.kv_event_format import BlockStored, parse_frames, wire_block_hash
from tests.procs import ManagedProcess, free_port, http, start_engines

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
BLOCK = 16
COMMON = ("--threads", "1", "--num-blocks", "200", "--max-model-len", "2048", "--check-invariants")
PREFILL_LEG = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
PROMPT = "The history of the printing press begins in " + " ".join(f"city{i}" for i in range(70))
CHAT = [{"role": "system", "content": "You are a careful historian. " * 12}, {"role": "user", "content": PROMPT}]


def connector(port: int | None = None) -> tuple[str, str]:
    config: dict[str, Any] = {"kv_role": "kv_both"}
    if port is not None:
        config["kv_port"] = port
    return ("--kv-transfer-config", orjson.dumps(config).decode())


class Fleet:
    def __init__(self, prefill: ManagedProcess, decode: ManagedProcess, aggregated: ManagedProcess,
                 doomed: ManagedProcess, events: str) -> None:  # fmt: skip
        self.prefill, self.decode, self.aggregated, self.doomed, self.events = (
            prefill,
            decode,
            aggregated,
            doomed,
            events,
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("pd-engines")
    events = f"tcp://127.0.0.1:{free_port()}"
    starts = {
        "prefill": (*COMMON, *connector(free_port())),
        "decode": (*COMMON, *connector(), "--kv-events", events),
        "aggregated": COMMON,
        "doomed": (*COMMON, *connector()),
    }
    engines = start_engines(tmp, starts)
    yield Fleet(engines["prefill"], engines["decode"], engines["aggregated"], engines["doomed"], events)
    for engine in engines.values():
        engine.stop()


def post(engine: ManagedProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = http("POST", f"{engine.url}{path}", body, timeout=300)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert isinstance(answer, dict)
    return answer


def metric(engine: ManagedProcess, name: str, label: str = "") -> float:
    text = http("GET", f"{engine.url}/metrics").body.decode()
    lines = [line for line in text.splitlines() if line.startswith(name + "{") and label in line]
    assert lines, f"{name}{{{label}}} not exported"
    return float(lines[0].rsplit(" ", 1)[1])


def free_blocks(engine: ManagedProcess) -> int:
    return decode_stats(http("GET", f"{engine.url}/stats").body).free_blocks


def disaggregated(
    prefill: ManagedProcess, decode: ManagedProcess, path: str, body: dict[str, Any]
) -> tuple[dict, dict]:
    """The gateway's two legs: the prefill answer and the decode answer."""
    first = post(prefill, path, {**body, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})
    return first, post(decode, path, {**body, "kv_transfer_params": first["kv_transfer_params"]})


def text_of(answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def cached(answer: dict[str, Any]) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": CHAT}),
    ],
)
def test_decode_leg_equals_the_aggregated_engine(fleet: Fleet, path: str, body: dict[str, Any]) -> None:
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, **body}
    expected = post(fleet.aggregated, path, body)
    pulled_before = metric(fleet.decode, "kvgate:kv_transfer_blocks_total", 'direction="pulled"')
    prefill, decode = disaggregated(fleet.prefill, fleet.decode, path, body)
    params = prefill["kv_transfer_params"]
    prompt_tokens = expected["usage"]["prompt_tokens"]
    full_blocks = (prompt_tokens - 1) // BLOCK
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_host"] == "127.0.0.1" and params["tp_size"] == 1
    assert isinstance(params["remote_engine_id"], str) and isinstance(params["remote_request_id"], str)
    assert len(params["remote_block_ids"]) == full_blocks
    assert prefill["usage"]["completion_tokens"] == 1 and cached(prefill) == 0
    assert text_of(decode) == text_of(expected)
    assert decode["usage"]["prompt_tokens"] == prompt_tokens and decode["usage"]["completion_tokens"] == 16
    assert cached(decode) == full_blocks * BLOCK, "pulled tokens count as cached (vLLM: local + external)"
    pulled = metric(fleet.decode, "kvgate:kv_transfer_blocks_total", 'direction="pulled"') - pulled_before
    assert pulled == full_blocks
    assert metric(fleet.prefill, "kvgate:kv_transfer_held_blocks") == 0
    assert free_blocks(fleet.prefill) == 200 and free_blocks(fleet.decode) == 200


def test_a_follow_up_pulls_only_what_the_decode_engine_lacks(fleet: Fleet) -> None:
    tokenizer = ChatTokenizer.load(MODEL)
    first_prompt = "A survey of bridges: " + " ".join(f"bridge{i}" for i in range(60))
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0}
    first_ids = tokenizer.encode_text(first_prompt)
    first_blocks = (len(first_ids) - 1) // BLOCK
    expected_hashes = block_hashes(first_ids, BLOCK, MODEL)[:first_blocks]
    expected_stored = {wire_block_hash(hash_to_bytes(h)) for h in expected_hashes}
    subscriber = zmq.Context.instance().socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.setsockopt(zmq.RCVTIMEO, 5000)
    subscriber.connect(fleet.events)
    try:
        _, first = disaggregated(fleet.prefill, fleet.decode, "/v1/completions", {**body, "prompt": first_prompt})
        stored = received_stored_hashes(subscriber, expected_stored)
    finally:
        subscriber.close(linger=0)
    assert cached(first) == first_blocks * BLOCK
    assert expected_stored <= stored, "installed blocks are published"

    follow_up = first_prompt + " and then " + " ".join(f"tower{i}" for i in range(40))
    pulled_before = metric(fleet.decode, "kvgate:kv_transfer_blocks_total", 'direction="pulled"')
    prefill, decode = disaggregated(fleet.prefill, fleet.decode, "/v1/completions", {**body, "prompt": follow_up})
    follow_ids = tokenizer.encode_text(follow_up)
    follow_blocks = (len(follow_ids) - 1) // BLOCK
    follow_hashes = set(block_hashes(follow_ids, BLOCK, MODEL))
    shared = sum(1 for block_hash in expected_hashes if block_hash in follow_hashes)
    pulled = metric(fleet.decode, "kvgate:kv_transfer_blocks_total", 'direction="pulled"') - pulled_before
    assert pulled == follow_blocks - shared, "blocks the decode engine held were not pulled again"
    assert cached(prefill) == shared * BLOCK, "the prefill engine hit its own cache too"
    assert cached(decode) == follow_blocks * BLOCK
    expected = post(fleet.aggregated, "/v1/completions", {**body, "prompt": follow_up})
    assert text_of(decode) == text_of(expected)


def received_stored_hashes(subscriber: zmq.Socket, expected: set[int]) -> set[int]:
    """The stored blocks' hashes published, read until ``expected`` are all among them or nothing came
    for the socket's receive timeout (not always for that long: 5 s of every run)."""
    hashes: set[int] = set()
    while not expected <= hashes:
        try:
            _, batch = parse_frames(subscriber.recv_multipart())
        except zmq.Again:
            return hashes
        for event in batch.events:
            if isinstance(event, BlockStored):
                hashes.update(wire_block_hash(h) for h in event.block_hashes)
    return hashes


def test_a_dead_prefill_engine_leaves_the_decode_engine_to_prefill(fleet: Fleet) -> None:
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0,
            "prompt": "Notes on rivers and their deltas: " + " ".join(f"river{i}" for i in range(50))}  # fmt: skip
    first = post(fleet.doomed, "/v1/completions", {**body, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})
    fleet.doomed.kill()
    fallbacks = metric(fleet.decode, "kvgate:kv_transfer_fallbacks_total", 'reason="unreachable"')
    decode = post(fleet.decode, "/v1/completions", {**body, "kv_transfer_params": first["kv_transfer_params"]})
    assert metric(fleet.decode, "kvgate:kv_transfer_fallbacks_total", 'reason="unreachable"') == fallbacks + 1
    assert cached(decode) == 0, "nothing came over, everything was computed here"
    assert text_of(decode) == text_of(post(fleet.aggregated, "/v1/completions", body))
    assert free_blocks(fleet.decode) == 200


def test_an_engine_without_the_flag_refuses_kv_transfer_params(fleet: Fleet) -> None:
    reply = http("POST", f"{fleet.aggregated.url}/v1/completions",
                 {"model": MODEL, "prompt": "hi", "kv_transfer_params": PREFILL_LEG})  # fmt: skip
    assert reply.status == 400
    error = reply.json()
    assert isinstance(error, dict) and error["error"]["param"] == "kv_transfer_params"
    streamed = http("POST", f"{fleet.prefill.url}/v1/chat/completions",
                    {"model": MODEL, "messages": CHAT, "stream": True, "kv_transfer_params": PREFILL_LEG})  # fmt: skip
    assert streamed.status == 400
