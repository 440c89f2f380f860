"""Through the gateway to a bundled engine (--sim): a second, noisy spelling of a long system
prompt hits the engine's prefix cache when normalization is on, and misses when it is off."""

import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.procs import HttpReply, ManagedProcess, free_port, http, start_engine, start_gateway

MODEL = "smollm2-135m"
LINES = [
    f"Rule {number}: answer the customer of Café Zürich politely, briefly and in their language."
    for number in range(30)
]
CANONICAL = "\n".join(LINES)
NOISY = unicodedata.normalize("NFD", "\r\n".join(line + "  " for line in LINES)) + "\r\n"


def deployment(tmp_path: Path, normalize: dict) -> tuple[ManagedProcess, ManagedProcess]:
    engine = start_engine(tmp_path, "--sim", "--num-blocks", "512")
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": MODEL,
        "backends": [{"name": "engine-0", "url": engine.url}],
        "normalize": normalize,
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    try:
        return engine, start_gateway(tmp_path, config_path, port)
    except Exception:
        engine.stop()
        raise


@pytest.fixture(params=[True, False], ids=["normalize-on", "normalize-off"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ManagedProcess, bool]]:
    engine, gateway = deployment(tmp_path, {"enabled": request.param})
    yield gateway, request.param
    gateway.stop()
    engine.stop()


def chat(gateway: ManagedProcess, system: str) -> HttpReply:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Can I book for four?"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    reply = http("POST", f"{gateway.url}/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    return reply


def header(reply: HttpReply, name: str) -> str | None:
    return {key.lower(): value for key, value in reply.headers.items()}.get(name)


def test_second_variant_hits_only_when_normalized(gateway: tuple[ManagedProcess, bool]) -> None:
    server, normalized = gateway
    first = chat(server, CANONICAL).json()
    second_reply = chat(server, NOISY)
    second = second_reply.json()
    prompt_tokens = first["usage"]["prompt_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert prompt_tokens > 400
    if normalized:
        assert second["usage"]["prompt_tokens"] == prompt_tokens
        assert cached >= (prompt_tokens - 1) // 16 * 16 - 16
        changed = header(second_reply, "x-kvgate-normalized")
        assert changed is not None and {"nfc", "line_endings", "trailing_whitespace", "strip_message"} <= set(
            changed.split(",")
        )
        assert header(chat(server, CANONICAL), "x-kvgate-normalized") is None
    else:
        assert cached <= 32
        assert header(second_reply, "x-kvgate-normalized") is None
