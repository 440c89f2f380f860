"""Through the gateway to a bundled engine (--sim): a second, noisy spelling of a long system
prompt hits the engine's prefix cache when normalization is on, and misses when it is off."""

import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_cluster import chat, gateway_with_engines, post_chat
from tests.procs import HttpReply, ManagedProcess

LINES = [
    f"Rule {number}: answer the customer of Café Zürich politely, briefly and in their language."
    for number in range(30)
]
CANONICAL = "\n".join(LINES)
NOISY = unicodedata.normalize("NFD", "\r\n".join(line + "  " for line in LINES)) + "\r\n"


@pytest.fixture(params=[True, False], ids=["normalize-on", "normalize-off"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ManagedProcess, bool]]:
    with gateway_with_engines(
        tmp_path, [("--sim", "--sim-preset", "instant", "--num-blocks", "512")], normalize={"enabled": request.param}
    ) as gw:
        yield gw, request.param


def ask(gateway: ManagedProcess, system: str) -> HttpReply:
    return post_chat(gateway, chat("Can I book for four?", 4, system=system, temperature=0))


def header(reply: HttpReply, name: str) -> str | None:
    return {key.lower(): value for key, value in reply.headers.items()}.get(name)


def test_second_variant_hits_only_when_normalized(gateway: tuple[ManagedProcess, bool]) -> None:
    server, normalized = gateway
    first = ask(server, CANONICAL).json()
    second_reply = ask(server, NOISY)
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
        assert header(ask(server, CANONICAL), "x-kvgate-normalized") is None
    else:
        assert cached <= 32
        assert header(second_reply, "x-kvgate-normalized") is None
