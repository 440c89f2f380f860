"""Hypothesis sends well over 1,000 malformed requests: only OpenAI-shaped 4xx (or a 200), never a 5xx.

Malformed means bodies (mutated fields, noise, deep nesting), headers with bytes that are not
ASCII, token-id prompts out of any vocabulary's range, and compressed bodies (valid, truncated,
mislabelled). Every body is sent whole, so a 408 (a body awaited as if it never came) fails too.
The gateway must still serve afterwards, and its memory must stay flat.
"""

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway_cluster import MODEL, chat, gateway_with_engines
from tests.procs import ManagedProcess, http

PATHS = ["/v1/chat/completions", "/v1/completions"]
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "cache_salt",
    "user",
    "stop",
    "seed",
    "logprobs",
    "response_format",
    "ignore_eos",
    "unknown_field",
]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls"]
EXAMPLES = 1200
KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEADER_NAMES = ["x-request-id", "Authorization", "x-session-id", "Content-Type", "Accept", "x-fuzz"]
ENCODINGS = ["gzip", "deflate", "br", "zstd", "identity", "compress", "gzip, deflate", "x-unknown"]
MAX_RSS_GROWTH_KIB = 30_000

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=16,
)


def base_body(path: str) -> dict:
    if path == "/v1/completions":
        return {"model": MODEL, "prompt": "Say something.", "max_tokens": 4}
    return chat("Say something.", 4)


Request = tuple[str, bytes, dict[str, str]]


@st.composite
def mutated_bodies(draw: st.DrawFn) -> Request:
    """A valid body with one top-level field or one message field replaced by an arbitrary JSON value."""
    path = draw(st.sampled_from(PATHS))
    body = base_body(path)
    if path == PATHS[0] and draw(st.booleans()):
        body["messages"] = [{**body["messages"][0], draw(st.sampled_from(MESSAGE_FIELDS)): draw(json_values)}]
    else:
        body[draw(st.sampled_from(FIELDS))] = draw(json_values)
    return path, json.dumps(body).encode(), AUTH


@st.composite
def raw_bodies(draw: st.DrawFn) -> Request:
    """Bytes that are not a valid request at all: noise, truncations, bad UTF-8, deep nesting."""
    path = draw(st.sampled_from(PATHS))
    valid = json.dumps(base_body(path)).encode()
    depth = draw(st.integers(1, 3000))
    choices = [
        draw(st.binary(max_size=200)),
        valid[: draw(st.integers(0, len(valid) - 1))],
        valid.replace(b"Say something.", draw(st.binary(min_size=1, max_size=20)).replace(b'"', b"") + b"\xff\xfe"),
        b'{"model": "' + MODEL.encode() + b'", "messages": ' + b"[" * depth + b"]" * depth + b"}",
        json.dumps({**base_body(path), "extra": json.loads("[" * min(depth, 900) + "]" * min(depth, 900))}).encode(),
        json.dumps(draw(json_values)).encode(),
    ]
    return path, draw(st.sampled_from(choices)), AUTH


@st.composite
def hostile_headers(draw: st.DrawFn) -> Request:
    """A valid request whose headers carry arbitrary bytes (latin-1 on the wire: 0x80-0xff included)."""
    path = draw(st.sampled_from(PATHS))
    values = st.binary(min_size=0, max_size=40).map(
        lambda raw: raw.decode("latin-1").translate({0: None, 10: None, 13: None}).strip()
    )
    headers = dict(AUTH)
    for name in draw(st.lists(st.sampled_from(HEADER_NAMES), min_size=1, max_size=3, unique=True)):
        value = draw(values)
        headers[name] = f"Bearer {value}" if name == "Authorization" and draw(st.booleans()) else value
    return path, json.dumps(base_body(path)).encode(), headers


@st.composite
def token_id_prompts(draw: st.DrawFn) -> Request:
    """A completions prompt of token ids, some negative, past 2**32 or past 64 bits."""
    ids = st.one_of(
        st.integers(0, 50_000),
        st.integers(-(2**40), 2**40),
        st.sampled_from([-1, 0, 2**32 - 1, 2**32, 2**63 - 1, 2**64, -(2**63)]),
    )
    prompt = draw(st.lists(ids, min_size=0, max_size=48))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    return PATHS[1], json.dumps(body).encode(), AUTH


@st.composite
def compressed_bodies(draw: st.DrawFn) -> Request:
    """A body compressed right, truncated, as garbage, or labelled with the wrong or an unknown encoding."""
    path = draw(st.sampled_from(PATHS))
    plain = json.dumps(base_body(path)).encode()
    packed = draw(st.sampled_from([gzip.compress(plain), zlib.compress(plain), plain, b""]))
    variants = [packed, packed[: draw(st.integers(0, max(len(packed) - 1, 0)))], draw(st.binary(max_size=64))]
    encoding = draw(st.sampled_from(ENCODINGS))
    return path, draw(st.sampled_from(variants)), {**AUTH, "Content-Encoding": encoding}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    with gateway_with_engines(
        tmp_path_factory.mktemp("fuzz"),
        limits={"max_tokens": 8, "max_tokens_policy": "clamp"},
        tenants=[{"name": "fuzz", "api_keys": [KEY]}],
    ) as gateway:
        yield gateway


def send(gateway: ManagedProcess, path: str, body: bytes, headers: dict[str, str]) -> None:
    reply = http("POST", f"{gateway.url}{path}", body, headers)
    # Never a 408 either: every body here is sent whole, so "did not arrive" would be a body the gateway
    # failed to read and awaited until timeouts.client_body_s (30 s each, as a deflate stream that fails
    # at its end did: tests/faults/test_hostile_requests.py).
    assert reply.status < 500 and reply.status != 408, (path, body[:300], headers, reply.status, reply.body[:300])
    if reply.status >= 400:
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)


@pytest.mark.slow
def test_malformed_requests_never_get_a_5xx(gateway: ManagedProcess) -> None:
    sent = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(mutated_bodies(), raw_bodies(), hostile_headers(), token_id_prompts(), compressed_bodies()))
    def fuzz(request: Request) -> None:
        send(gateway, *request)
        sent.append(request)

    fuzz()
    warm_rss = rss_kib(gateway.proc.pid)
    fuzz()
    assert len(sent) >= 2 * 1000
    assert rss_kib(gateway.proc.pid) - warm_rss < MAX_RSS_GROWTH_KIB
    reply = http("POST", f"{gateway.url}/v1/chat/completions", json.dumps(chat("Still there?", 4)).encode(), AUTH)
    assert reply.status == 200 and reply.json()["choices"]
