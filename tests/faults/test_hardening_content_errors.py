"""Content a client controls never makes an engine answer 5xx, never ejects a replica, and never
breaks a request head (issue 28, findings 2 and 12), on real processes over loopback.

- Finding 2: ``logit_bias: {"²": 1}`` passed ``str.isdigit`` and failed ``int()``: the engine
  answered 500, the gateway counted a breaker failure on every replica it retried, and three such
  requests ejected them all. The class: a table of hostile values for every request field, sent
  straight to a simulated engine and to the real model (whose sampler sees what the simulator
  does not: ``top_k`` 2**63 used to fail every request in the batch), must draw no 5xx.
- Finding 12: a ``tracestate`` that is not UTF-8, beside a valid ``traceparent``, made the
  gateway answer 500 without a request-log line; ``baggage`` did the same to the engine.
"""

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.server.openai_checks import parse_request, sampling_params
from protocol.openai import ChatCompletionRequest
from protocol.openai_errors import OpenAIError
from tests.faults.hostile import log_lines, raw_post, wait_for
from tests.gateway_cluster import MODEL, gateway_config, gateway_for, running, start_engines
from tests.procs import ManagedProcess, free_port, http, start_engine

ADMIN = "content-admin-key"
ATTACKER, OTHER = "key-attacker", "key-other"
TENANTS = [{"name": "attacker", "api_keys": [ATTACKER]}, {"name": "other", "api_keys": [OTHER]}]
SIM = ("--sim", "--sim-preset", "instant", "--max-model-len", "1024")
REAL = ("--num-blocks", "96", "--max-model-len", "512", "--threads", "1")
TRACEPARENT = b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

BAD_LOGIT_BIAS_KEYS = ["²", "٣", "1²", "１", " 1", "+1", "1e3", "0x1", "-1", "1.0", "", "99999999999", "1" * 5000]
HOSTILE_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    2**31,
    2**63,
    -(2**63),
    2**64,
    1e308,
    -1e308,
    0.5,
    "",
    "²",
    "\x00",
    "a" * 300,
    [],
    [1],
    ["x"] * 5,
    [""],
    [[]],
    {},
    {"a": 1},
    {"²": 1},
    {"1": 1e308},
    {"0": 100.0001},
    {"99999999999": 1},
    {"1" * 5000: 1},
]
FIELDS = [
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "ignore_eos",
    "cache_salt",
    "kvgate_session",
    "logprobs",
    "top_logprobs",
    "echo",
    "tools",
    "tool_choice",
    "response_format",
]
SAMPLER_FIELDS = ["top_k", "seed", "temperature", "top_p", "logit_bias", "logprobs", "top_logprobs", "n", "stop"]
"""The fields the real model's sampler reads, where a value the simulator takes in stride can still fail."""


@dataclass
class Cluster:
    gateway: ManagedProcess
    engines: list[ManagedProcess]
    log: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp_path = tmp_path_factory.mktemp("content-errors")
    log = tmp_path / "requests.log"
    with running(start_engines(tmp_path, 2, *SIM)) as engines:
        config = gateway_config(
            free_port(),
            engines,
            tenants=TENANTS,
            admin={"api_key": ADMIN},
            observability={"request_log_path": str(log)},
            health={"interval_s": 0.5, "timeout_s": 1.0, "eject_after_failures": 3, "eject_s": 60},
        )
        with gateway_for(tmp_path, config) as gateway:
            yield Cluster(gateway, engines, log)


def base_body(path: str, max_tokens: int = 3) -> dict[str, Any]:
    if path == "/v1/completions":
        return {"model": MODEL, "prompt": "Say something.", "max_tokens": max_tokens}
    return {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": max_tokens}


def breakers(cluster: Cluster) -> dict[str, tuple[bool, str]]:
    reply = http("GET", f"{cluster.gateway.url}/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"})
    assert reply.status == 200, reply.body
    backends: Any = reply.json()
    return {backend["name"]: (backend["healthy"], backend["breaker"]) for backend in backends["backends"]}


def test_bad_logit_bias_keys_get_400_and_eject_no_replica(cluster: Cluster) -> None:
    healthy = {"e0": (True, "closed"), "e1": (True, "closed")}
    assert breakers(cluster) == healthy
    headers = {"Authorization": f"Bearer {ATTACKER}"}
    for count in (3, 30):
        for index in range(count):
            key = BAD_LOGIT_BIAS_KEYS[index % len(BAD_LOGIT_BIAS_KEYS)]
            path = ("/v1/chat/completions", "/v1/completions")[index % 2]
            body = {**base_body(path), "logit_bias": {key: 1}, "stream": index % 3 == 0}
            reply = http("POST", f"{cluster.gateway.url}{path}", body, headers)
            error: Any = reply.json()
            assert reply.status == 400 and error["error"]["param"] == "logit_bias", (key, reply.body[:300])
        assert breakers(cluster) == healthy
        for path in ("/v1/chat/completions", "/v1/completions"):
            reply = http("POST", f"{cluster.gateway.url}{path}", base_body(path), {"Authorization": f"Bearer {OTHER}"})
            assert reply.status == 200, reply.body
    for value in (100.5, -101, 1e300):
        body = {**base_body("/v1/chat/completions"), "logit_bias": {"42": value}}
        reply = http("POST", f"{cluster.gateway.url}/v1/chat/completions", body, headers)
        assert reply.status == 400, (value, reply.body)


async def _hostile_table(url: str, fields: list[str], max_tokens: int) -> list[str]:
    """Each hostile value in each field of both generation endpoints (whole or streamed, in turn),
    straight to an engine; every answer that is a 5xx (or an error event inside a 200 stream)."""
    failures: list[str] = []
    gate = asyncio.Semaphore(4)

    async def one(session: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> None:
        async with gate, session.post(f"{url}{path}", data=json.dumps(body)) as reply:
            data = await reply.read()
        if reply.status >= 500 or (reply.status == 200 and b'"error"' in data):
            failures.append(f"{path} {json.dumps(body)[:200]} -> {reply.status} {data[:200]!r}")

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, headers={"Content-Type": "application/json"}) as session:
        jobs = []
        for path in ("/v1/chat/completions", "/v1/completions"):
            for field in fields:
                for index, value in enumerate(HOSTILE_VALUES):
                    body = {**base_body(path, max_tokens), "stream": (index + len(field)) % 2 == 0, field: value}
                    jobs.append(one(session, path, body))
        await asyncio.gather(*jobs)
    return failures


async def test_no_hostile_field_value_makes_the_simulated_engine_answer_5xx(cluster: Cluster) -> None:
    assert await _hostile_table(cluster.engines[0].url, FIELDS, 3) == []
    assert http("GET", f"{cluster.engines[0].url}/health").status == 200


JSON_NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False))
KEYS = st.one_of(st.text(max_size=12), st.integers(-(2**40), 2**40).map(str), st.sampled_from(BAD_LOGIT_BIAS_KEYS))


@given(st.dictionaries(KEYS, JSON_NUMBERS, max_size=4), st.one_of(st.none(), st.integers(-(2**70), 2**70)))
def test_any_logit_bias_or_top_k_is_taken_or_refused_with_a_400(bias: dict[str, Any], top_k: int | None) -> None:
    """The engine's own checks, as its handler runs them on every JSON body: a parameter set the
    sampler can use, or a 400 that names the field, and nothing else."""
    body = {**base_body("/v1/chat/completions"), "logit_bias": bias, "top_k": top_k}
    try:
        request = parse_request(json.dumps(body).encode(), ChatCompletionRequest)
        params = sampling_params(request, 10, 1024, 49152)
    except OpenAIError as error:
        assert error.status == 400 and (error.param or "").split(".")[0] in ("logit_bias", "top_k"), error.message
        return
    assert 0 <= params.top_k <= 49152
    assert all(0 <= token < 49152 and -100 <= value <= 100 for token, value in params.logit_bias.items())


@pytest.fixture(scope="module")
def real_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("content-errors-real")
    with running([start_engine(tmp_path, *REAL, name="real")]) as engines:
        yield engines[0]


BYSTANDER_TOKENS = 32
"""Each bystander's length: the next one starts when it has streamed half of these, so one is always in
the batch, and the last ends at most about half of these after the table (a single bystander of 400
tokens spanned the table's ~65 steps and then ran 20 s alone)."""


async def _bystanders(url: str, table_done: asyncio.Event, first_running: asyncio.Event) -> list[bytes]:
    """Streams of BYSTANDER_TOKENS tokens, overlapping (each starts when the one before has streamed half
    of its tokens), from before the table (``first_running``: the first has its first token) until one
    has streamed half of its tokens after ``table_done``: every step of the table has one in its batch."""
    body = {**base_body("/v1/completions", BYSTANDER_TOKENS), "ignore_eos": True, "stream": True}

    async def one(session: aiohttp.ClientSession, halfway: asyncio.Event) -> bytes:
        streamed, tokens = b"", 0
        try:
            async with session.post(f"{url}/v1/completions", json=body) as reply:
                async for line in reply.content:
                    streamed += line
                    tokens += line.startswith(b"data: {")
                    first_running.set()
                    if tokens >= BYSTANDER_TOKENS // 2:
                        halfway.set()
        finally:
            first_running.set()
            halfway.set()
        return streamed

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        streams = []
        while not table_done.is_set():
            halfway = asyncio.Event()
            streams.append(asyncio.create_task(one(session, halfway)))
            await halfway.wait()
            if streams[-1].done():  # it ended before half its tokens (an error): the test fails on it
                break
        return await asyncio.gather(*streams)


async def test_no_hostile_sampler_value_fails_the_real_model_or_its_batch(real_engine: ManagedProcess) -> None:
    """Bystanders' streams run through the whole table, one always in the batch, and each must finish
    whole: a sampler failure would fail every request in the step, a bystander's too."""
    table_done, first_running = asyncio.Event(), asyncio.Event()
    bystanders = asyncio.create_task(_bystanders(real_engine.url, table_done, first_running))
    await first_running.wait()
    failures = await _hostile_table(real_engine.url, SAMPLER_FIELDS, 2)
    table_done.set()
    streams = await bystanders
    assert failures == []
    for stream in streams:
        assert b'"error"' not in stream and stream.rstrip().endswith(b"data: [DONE]"), stream[-300:]
    assert len(streams) > 1, "the table was over within half a bystander: no hand-over was exercised"


@pytest.mark.parametrize(
    "header",
    [
        b"tracestate: \xff\xfe=\xfd",
        b"tracestate: vendor=\xc3\xa9",
        b"tracestate: " + b"k=v," * 400,
        b"tracestate: not a tracestate",
        b"baggage: user=\xff\xfe",
        b"x-session-id: \xff\xfe",
        b"x-request-id: \xff\xfe",
    ],
    ids=["tracestate-bytes", "tracestate-utf8", "tracestate-long", "tracestate-malformed", "baggage", "session", "id"],
)
def test_header_bytes_that_are_not_ascii_are_served_and_logged(cluster: Cluster, header: bytes) -> None:
    body = json.dumps(base_body("/v1/chat/completions")).encode()
    before = len(log_lines(cluster.log))
    auth = f"Authorization: Bearer {OTHER}".encode()
    status, _, reply = raw_post(cluster.gateway.port, "/v1/chat/completions", body, auth, TRACEPARENT, header)
    assert status == 200, reply[:300]
    assert wait_for(lambda: len(log_lines(cluster.log)) > before), "the request was logged"
    for engine in cluster.engines:
        status, _, reply = raw_post(engine.port, "/v1/chat/completions", body, TRACEPARENT, header)
        assert status == 200, reply[:300]
