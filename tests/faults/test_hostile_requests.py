"""An authenticated but hostile client, one reproduction of issue 18 per test, on real processes.

Caps and budgets hold whatever alias or exit the client picks, every request is recorded however
it ends, and input no HTTP library would send gets a 4xx, never a 500.
"""

import asyncio
import gzip
import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.faults.hostile import log_lines, metric_sums, raw_http, raw_post, recorded_requests, total, wait_for
from tests.gateway_cluster import MODEL, chat, gateway_config, gateway_for, get_json, running, start_engines
from tests.procs import ManagedProcess, free_port, http

ADMIN = "hostile-admin-key"
OPEN, CAPPED, BUDGET = "key-open", "key-capped", "key-budget"
CAP = 16
BUDGET_PER_MINUTE = 600
TENANTS = [
    {"name": "open", "api_keys": [OPEN]},
    {"name": "capped", "api_keys": [CAPPED], "limits": {"max_tokens": CAP, "max_tokens_policy": "clamp"}},
    {"name": "budget", "api_keys": [BUDGET], "tokens_per_minute": BUDGET_PER_MINUTE},
]
FAST_DECODE = ("--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.004")
"""About 250 tokens a second: a 200-token stream lasts long enough to leave it before its end."""


@dataclass
class Cluster:
    gateway: ManagedProcess
    log: Path

    @property
    def url(self) -> str:
        return self.gateway.url

    @property
    def port(self) -> int:
        return self.gateway.port


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp_path = tmp_path_factory.mktemp("hostile")
    log = tmp_path / "requests.log"
    with running(start_engines(tmp_path, 1, *FAST_DECODE)) as engines:
        config = gateway_config(
            free_port(),
            engines,
            tenants=TENANTS,
            admin={"api_key": ADMIN},
            observability={"request_log_path": str(log)},
            timeouts={"client_headers_s": 1.0, "client_body_s": 1.0},
        )
        with gateway_for(tmp_path, config) as gateway:
            yield Cluster(gateway, log)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def post(cluster: Cluster, path: str, body: dict, key: str = OPEN, **headers: str) -> tuple[int, dict, dict]:
    reply = http("POST", f"{cluster.url}{path}", body, headers={**auth(key), **headers})
    return reply.status, reply.headers, json.loads(reply.body)


def test_no_cap_alias_widens_the_grant_on_completions(cluster: Cluster) -> None:
    """18.1: max_completion_tokens on /v1/completions used to reach the engine, which ignores it."""
    body = {"model": MODEL, "prompt": "Story:", "ignore_eos": True}
    status, _, reply = post(cluster, "/v1/completions", {**body, "max_completion_tokens": 1}, CAPPED)
    assert status == 200 and reply["usage"]["completion_tokens"] == 1
    status, _, reply = post(cluster, "/v1/completions", {**body, "max_completion_tokens": 5000}, CAPPED)
    assert status == 200 and reply["usage"]["completion_tokens"] == CAP
    status, _, reply = post(cluster, "/v1/completions", body, CAPPED)
    assert status == 200 and reply["usage"]["completion_tokens"] == CAP


async def leave_after(
    session: aiohttp.ClientSession, url: str, key: str, events: int, max_tokens: int, request_id: str | None = None
) -> int:
    """Stream, read ``events`` token chunks, then drop the connection; the status."""
    body = {**chat("Tell me a long story.", max_tokens, ignore_eos=True), "stream": True}
    headers = auth(key) | ({"x-request-id": request_id} if request_id else {})
    reply = await session.post(url, json=body, headers=headers)
    if reply.status != 200:
        await reply.read()
        return reply.status
    seen = 0
    async for line in reply.content:
        if line.startswith(b"data: {") and b'"content":""' not in line:
            seen += 1
            if seen == events:
                break
    reply.close()
    return reply.status


async def test_leaving_before_done_is_charged_for_what_was_streamed(cluster: Cluster) -> None:
    """18.2: five streams of 200 tokens left one chunk early all fitted a 600-token budget."""
    async with aiohttp.ClientSession() as session:
        statuses = [
            await leave_after(session, f"{cluster.url}/v1/chat/completions", BUDGET, 199, 200) for _ in range(5)
        ]
    assert statuses[0] == 200 and 429 in statuses, statuses


async def test_every_request_is_recorded_however_it_ends(cluster: Cluster) -> None:
    """18.2: mid-stream leavers wrote no log line and no kvgate_requests_total sample.

    Earlier tests' requests are recorded before the counts are taken (a client that left is
    noticed when the gateway next writes to it, which can come late), and this test's requests
    carry ids of their own.
    """
    url = f"{cluster.url}/v1/chat/completions"
    tag = f"rec-{uuid.uuid4().hex[:8]}"

    def gone_recorded() -> float:
        return total(metric_sums(cluster.url, ADMIN), "kvgate_requests_total", status="client_gone")

    def counts() -> tuple[int, float, float]:
        return len(log_lines(cluster.log)), recorded_requests(cluster.url, ADMIN), gone_recorded()

    def settled() -> bool:
        before = counts()
        time.sleep(0.5)
        return counts() == before

    assert wait_for(settled), "earlier tests' requests are still being recorded"
    lines_before, recorded_before, gone_before = counts()
    leavers = 20
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        left = await asyncio.gather(
            *(leave_after(session, url, OPEN, 3, 200, f"{tag}-gone-{i}") for i in range(leavers))
        )
        assert left == [200] * leavers
        whole = [
            await session.post(url, json=chat(f"short {i}", 4), headers=auth(OPEN) | {"x-request-id": f"{tag}-ok-{i}"})
            for i in range(5)
        ]
        refused = [
            await session.post(url, data=b"{not json", headers=auth(OPEN) | {"x-request-id": f"{tag}-bad-{i}"})
            for i in range(5)
        ]
        assert [reply.status for reply in whole] == [200] * 5 and [reply.status for reply in refused] == [400] * 5
        for reply in whole + refused:
            reply.release()
    sent = leavers + 10

    def ours() -> list[dict]:
        lines = [json.loads(line) for line in log_lines(cluster.log)[lines_before:]]
        return [line for line in lines if line["request_id"].startswith(tag)]

    assert wait_for(lambda: len(ours()) == sent), (len(ours()), sent)
    assert wait_for(lambda: recorded_requests(cluster.url, ADMIN) - recorded_before == sent)
    assert gone_recorded() - gone_before == leavers
    assert sum(line["status"] == "client_gone" and line["completion_tokens"] >= 3 for line in ours()) == leavers


def test_non_utf8_header_bytes_get_a_4xx_or_an_answer_not_a_500(cluster: Cluster) -> None:
    """18.5: a 0xff byte in x-request-id (500 after the backend worked) or in Authorization (500)."""
    body = json.dumps(chat("hi", 2)).encode()
    bearer = f"Authorization: Bearer {OPEN}".encode()
    lines_before = len(log_lines(cluster.log))
    status, head, _ = raw_post(cluster.port, "/v1/chat/completions", body, bearer, b"x-request-id: ab\xffcd")
    assert status == 200 and b"x-request-id: req-" in head and b"\xff" not in head
    stream = json.dumps({**chat("hi", 2), "stream": True}).encode()
    status, _, streamed = raw_post(cluster.port, "/v1/chat/completions", stream, bearer, b"x-request-id: \xff\xfe")
    assert status == 200 and b"[DONE]" in streamed
    assert wait_for(lambda: len(log_lines(cluster.log)) - lines_before == 2)
    status, _, refused = raw_post(
        cluster.port, "/v1/chat/completions", body, b"Authorization: Bearer \xff" + OPEN.encode()
    )
    assert status == 401 and json.loads(refused)["error"]["code"] == "invalid_api_key"
    status, _, _ = raw_post(cluster.port, "/v1/chat/completions", body, bearer, b"x-session-id: \xff")
    assert status == 200


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(150_000)]},
        {"unknown_field": [{} for _ in range(400_000)]},
    ],
)
def test_bodies_of_many_small_objects_are_refused_before_parsing(cluster: Cluster, extra: dict) -> None:
    """18.4: a 150k-entry tools array or a 400k-object unknown field held the event loop for a second."""
    status, _, reply = post(cluster, "/v1/chat/completions", {**chat("hi", 2), **extra})
    assert status == 400 and reply["error"]["code"] == "too_many_json_values"


@pytest.mark.parametrize("bad_id", [-1, 2**32, 2**40])
def test_token_ids_out_of_range_get_a_400(cluster: Cluster, bad_id: int) -> None:
    """18.5: 16 or more ids with one negative or >= 2**32 raised OverflowError in radix/hashing.py."""
    body = {"model": MODEL, "prompt": [1] * 5 + [bad_id] + [1] * 20, "max_tokens": 2}
    status, _, reply = post(cluster, "/v1/completions", body)
    assert status == 400 and reply["error"]["param"].startswith("prompt")


def test_a_malformed_gzip_body_gets_a_400(cluster: Cluster) -> None:
    """18.5: a body aiohttp cannot decompress was a 500."""
    bearer = f"Authorization: Bearer {OPEN}".encode()
    status, _, reply = raw_post(cluster.port, "/v1/chat/completions", b"not gzip", bearer, b"Content-Encoding: gzip")
    assert status == 400 and json.loads(reply)["error"]["type"] == "invalid_request_error"
    body = gzip.compress(json.dumps(chat("hi", 2)).encode())
    assert raw_post(cluster.port, "/v1/chat/completions", body, bearer, b"Content-Encoding: gzip")[0] == 200


def test_a_deflate_body_that_fails_after_its_head_gets_a_400_at_once(cluster: Cluster) -> None:
    """A deflate body that does not decompress and arrives after its head (the parser fails at its
    end) was awaited until timeouts.client_body_s: a 408 saying it never came, then a second answer."""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nAuthorization: Bearer {OPEN}\r\n"
        "Content-Type: application/json\r\nContent-Encoding: deflate\r\nContent-Length: 2\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", cluster.port)) as sock:
        sock.sendall(head)
        time.sleep(0.2)  # the head is parsed alone: its handler waits for the body
        sock.sendall(b"%{")
        answer = closed_within(sock, 8)
    assert answer is not None, "still open after the answer: the parser cannot go on"
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.") == 1, answer
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["message"].endswith("decompressed.")


async def test_requests_sharing_an_x_request_id_keep_their_own_state(cluster: Cluster) -> None:
    """18.6: the router's pending table was keyed by x-request-id: calibration counted 1 of 60."""
    stats_url = f"{cluster.url}/dashboard/stats.json"
    async with aiohttp.ClientSession(headers=auth(ADMIN)) as admin:
        before = (await get_json(admin, stats_url))["prefix_index"]["calibration"]["count"]
        async with aiohttp.ClientSession(headers={**auth(OPEN), "x-request-id": "same-id"}) as session:
            url = f"{cluster.url}/v1/chat/completions"
            replies = await asyncio.gather(*(session.post(url, json=chat(f"q{i}", 20)) for i in range(60)))
            assert {reply.status for reply in replies} == {200}
            assert {reply.headers["x-request-id"] for reply in replies} == {"same-id"}
            for reply in replies:
                reply.release()
        after = (await get_json(admin, stats_url))["prefix_index"]["calibration"]["count"]
    assert after - before == 60


def closed_within(sock: socket.socket, timeout_s: float) -> bytes | None:
    """What the server sent before closing ``sock``, or None if it was still open after ``timeout_s``."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return data


def trickle(sock: socket.socket, data: bytes, seconds: float) -> bool:
    """Send ``data``, a byte every 0.1 s, for up to ``seconds``; whether the server hung up meanwhile."""
    deadline = time.monotonic() + seconds
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return False


def test_slow_trickle_connections_are_timed_out(cluster: Cluster) -> None:
    """18.6: headers or a body sent a byte at a time held a connection forever (limits here: 1 s)."""
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nAuthorization: Bearer {OPEN}\r\n".encode()
    with socket.create_connection(("127.0.0.1", cluster.port)) as sock:
        assert trickle(sock, head + b"X-Trickle: " + b"a" * 1000, seconds=15), "headers trickled in for ever"
    body = json.dumps(chat("hi", 2)).encode()
    with socket.create_connection(("127.0.0.1", cluster.port)) as sock:
        sock.sendall(head + f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n\r\n".encode())
        sock.sendall(body[:5])
        answer = closed_within(sock, 8)
    assert answer is not None, "still open: the rest of a timed-out body was awaited as long as aiohttp's 10 s linger"
    assert b" 408 " in answer.split(b"\r\n")[0]


def test_parser_errors_are_openai_shaped_and_quote_nothing(cluster: Cluster) -> None:
    """18.6: aiohttp answered in plain text, quoting the offending header (an API key, say)."""
    for bad in (b"X-Api-Key: sk-secret\x01value", b"Bad Name sk-secret: v"):
        status, head, body = raw_http(
            cluster.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + bad + b"\r\n\r\n"
        )
        assert status == 400 and b"application/json" in head and b"sk-secret" not in head + body
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_http_request"


def test_requests_refused_before_any_endpoint_are_recorded(cluster: Cluster) -> None:
    """Unparsable requests (aiohttp answers them before any middleware), unknown paths and heads
    that never finish get a request-log line and a kvgate_rejections_total sample each."""
    causes = ("invalid_http_request", "not_found", "request_header_timeout")

    def counts() -> dict[str, tuple[float, int]]:
        metrics = metric_sums(cluster.url, ADMIN)
        lines = [json.loads(line) for line in log_lines(cluster.log)]
        return {
            cause: (
                total(metrics, "kvgate_rejections_total", cause=cause),
                sum(line["error_code"] == cause and line["backend"] is None for line in lines),
            )
            for cause in causes
        }

    before = counts()
    unparsable = [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
        b"NOT AN HTTP REQUEST\r\n\r\n",
    ]
    for request in unparsable:
        status, _, _ = raw_http(cluster.port, request)
        assert 400 <= status < 500
    assert http("POST", f"{cluster.url}/v1/no-such-endpoint", {}).status == 404
    with socket.create_connection(("127.0.0.1", cluster.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        assert closed_within(sock, 15) == b"", "a head that never finishes is closed unanswered"
    expected = {"invalid_http_request": 3, "not_found": 1, "request_header_timeout": 1}

    def recorded() -> bool:
        now = counts()
        return all(
            (now[cause][0] - before[cause][0], now[cause][1] - before[cause][1]) == (count, count)
            for cause, count in expected.items()
        )

    assert wait_for(recorded), (before, counts())


@pytest.mark.parametrize(
    ("field", "value"), [("cache_salt", ""), ("temperature", "0.5"), ("top_p", "0.9"), ("temperature", True)]
)
def test_values_the_engine_refuses_are_refused_by_the_gateway(cluster: Cluster, field: str, value: object) -> None:
    """18.6: `cache_salt: ""` was routed unsalted and `temperature: "0.5"` passed, both failing at the engine."""
    status, headers, reply = post(cluster, "/v1/chat/completions", {**chat("hi", 2), field: value})
    assert status == 400 and reply["error"]["param"] == field
    assert "x-kvgate-backend" not in headers, "refused by the gateway, not by a backend"
