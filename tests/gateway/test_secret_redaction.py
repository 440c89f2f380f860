"""A backend's configured secrets never reach a client, in any encoding (issue 28, finding 13).

Reported: values of a backend's ``headers:`` (``X-Api-Key``) were echoed in 4xx error bodies, and
the ``api_key`` went out in 200 bodies and in ``\\u``-escaped error bodies. The provider here is a
real HTTP server on loopback that echoes every credential it gets, in every encoding, in every
place an answer has: error bodies of each status, whole answers, stream events, Content-Type.
"""

import base64
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus

import orjson
import pytest
from aiohttp import web

from gateway.backends.secret_redaction import Redactor, backend_secrets
from tests.gateway.fake_replica import FakeReplica, chat, gateway, gateway_config, replicas

API_KEY = f"sk-proj-{secrets.token_urlsafe(24)}/+x"
HEADER_KEY = f"hk-{secrets.token_hex(12)}"
PLAIN_HEADER = "2023-06-01"
"""A configured header that is no secret (``anthropic-version``): text that matches it stays."""


def _json_u_escaped(text: str) -> str:
    return "".join(f"\\u{ord(char):04x}" for char in text)


ENCODINGS: dict[str, Callable[[str], str]] = {
    "raw": lambda text: text,
    "json-u-escaped": _json_u_escaped,
    "json-u-escaped-upper": lambda text: _json_u_escaped(text).upper().replace("\\U", "\\u"),
    "partly-u-escaped": lambda text: text[:3] + _json_u_escaped(text[3:6]) + text[6:],
    "slash-escaped": lambda text: text.replace("/", "\\/"),
    "url-encoded": lambda text: quote(text, safe=""),
    "url-encoded-all": lambda text: "".join(f"%{byte:02x}" for byte in text.encode()),
    "form-encoded": lambda text: quote_plus(text),
    "base64": lambda text: base64.b64encode(f"Bearer {text}".encode()).decode(),
    "base64-urlsafe": lambda text: base64.urlsafe_b64encode(f"u:{text}".encode()).decode(),
    "base64-aligned": lambda text: base64.b64encode(text.encode()).decode(),
    "hex": lambda text: text.encode().hex(),
}


def leaked_forms(text: bytes) -> list[str]:
    """Which (secret, encoding) pairs ``text`` still holds, decoded as a client would."""
    found = []
    for secret_name, secret in (("api_key", API_KEY), ("X-Api-Key", HEADER_KEY)):
        for name, encode in ENCODINGS.items():
            if encode(secret).encode() in text:
                found.append(f"{secret_name} {name}")
    for name in ("api_key", "X-Api-Key"):
        if (API_KEY if name == "api_key" else HEADER_KEY).encode() in _decoded(text):
            found.append(f"{name} after JSON decoding")
    return found


def _decoded(text: bytes) -> bytes:
    """Every JSON string in ``text`` (a body or SSE events), decoded."""
    strings: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for line in text.splitlines() or [text]:
        payload = line.removeprefix(b"data: ").strip()
        try:
            walk(json.loads(payload))
        except ValueError:
            continue
    return "\n".join(strings).encode()


def echo_text(request: web.Request) -> str:
    """Every credential the request carried, in every encoding."""
    given = [request.headers.get("Authorization", ""), request.headers.get("X-Api-Key", "")]
    key = given[0].removeprefix("Bearer ")
    return " | ".join(f"{name}: {encode(value)}" for value in (key, given[1]) for name, encode in ENCODINGS.items())


@dataclass
class EchoingProvider(FakeReplica):
    """A remote provider that echoes its credentials: the prompt picks where (an error status, the
    whole answer, the stream) and how the echo is wrapped (JSON, or plain text)."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.echo)
        return app

    async def echo(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        echoed = echo_text(request)
        content_type = f"application/json; charset=utf-8; x-key={request.headers.get('X-Api-Key')}"
        if prompt.startswith("status "):
            status = int(prompt.split()[1])
            if prompt.endswith("text"):
                return web.Response(status=status, text=f"denied: {echoed}")
            error = {"error": {"message": f"denied: {echoed}", "type": "invalid_request_error"}}
            return web.Response(status=status, body=json.dumps(error), headers={"Content-Type": content_type})
        if not body.get("stream"):
            answer = {**self.whole_answer(), "debug": echoed}
            answer["choices"][0]["message"]["content"] = echoed
            data = json.dumps(answer, ensure_ascii=True).encode()
            return web.Response(body=data, headers={"Content-Type": content_type})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in echoed.split(" | "):
            chunk = {
                "id": "e",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": piece}}],
            }
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"id": "e", "object": "chat.completion.chunk", "choices": [], "usage": self.usage()}
        await response.write(b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response


@pytest.mark.parametrize(
    "prompt",
    ["status 400", "status 401", "status 403", "status 404 text", "status 429", "status 500", "status 503 text"],
)
async def test_error_bodies_of_every_status_hold_no_secret(prompt: str) -> None:
    await _assert_nothing_leaks(chat(prompt), expect_status=int(prompt.split()[1]))


async def test_whole_answers_hold_no_secret() -> None:
    await _assert_nothing_leaks(chat("answer"), expect_status=200)


async def test_streams_hold_no_secret() -> None:
    await _assert_nothing_leaks(chat("answer", 100, stream=True), expect_status=200)


async def _assert_nothing_leaks(body: dict[str, Any], expect_status: int) -> None:
    provider = EchoingProvider()
    async with replicas(provider) as urls:
        config = gateway_config(urls)
        config["backends"][0].update(
            api_key=API_KEY, headers={"X-Api-Key": HEADER_KEY, "anthropic-version": PLAIN_HEADER}
        )
        async with gateway(config, None) as client, client.post("/v1/chat/completions", json=body) as reply:
            status, headers, data = reply.status, reply.headers, await reply.read()
    expected = 502 if expect_status >= 500 else expect_status
    assert status == expected, data
    assert b"[redacted]" in data, "the provider did echo its credentials"
    assert leaked_forms(data) == []
    assert leaked_forms("\n".join(f"{name}: {value}" for name, value in headers.items()).encode()) == []


def test_each_encoding_is_redacted_and_plain_text_is_left_alone() -> None:
    redactor = Redactor(backend_secrets(API_KEY, {"X-Api-Key": HEADER_KEY, "anthropic-version": PLAIN_HEADER}))
    for secret in (API_KEY, HEADER_KEY):
        for name, encode in ENCODINGS.items():
            text = f'{{"message": "before {encode(secret)} after"}}'.encode()
            redacted = redactor.redact(text)
            assert leaked_forms(redacted) == [], name
            assert redacted.startswith(b'{"message": "before ') and redacted.endswith(b' after"}'), (name, redacted)
    ordinary = b'{"content": "On 2023-06-01, 50% of \\u00e9l\\u00e8ves paid $3 (see a/b?c=d%20e)."}'
    assert redactor.redact(ordinary) == ordinary


def test_only_credential_like_or_long_header_values_count_as_secrets() -> None:
    found = backend_secrets(None, {"X-Api-Key": "abcd1234", "anthropic-version": "2023-06-01", "x-trace": "on"})
    assert found == ("abcd1234",)
    long_value = "z" * 30
    assert backend_secrets("k" * 20, {"X-Custom": long_value}) == (long_value, "k" * 20)
    assert set(backend_secrets(None, {"Authorization": "Bearer tok-1234567"})) == {"Bearer tok-1234567", "tok-1234567"}
