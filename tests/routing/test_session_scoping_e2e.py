"""Another tenant cannot take an isolated tenant's session retention (issue 28, finding 7).

SmolLM2 for real behind a gateway with two tenants: the victim (isolated cache) opens a chat
under a session; the attacker then names the same session (header, ``user`` or body
``kvgate_session``) or floods sessions of its own, with long prompts that churn the engine's whole
cache. The victim's second turn must still find its first turn cached: its session is retained
under a key only it can name, and the retention bound is shared fairly between tenants.
"""

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_cluster import MODEL, gateway_config, gateway_for, running
from tests.procs import ManagedProcess, free_port, http, start_engine

pytestmark = pytest.mark.slow

NUM_BLOCKS = 32
"""512 tokens of KV, 16 blocks of them retainable: a fair share of 8 blocks for each tenant. Small,
because SmolLM2 prefills a few hundred tokens a second at best on a CPU (tens on a busy one)."""
VICTIM, ATTACKER = "sk-victim", "sk-attacker"
TENANTS = [
    {"name": "victim", "api_keys": [VICTIM], "isolate_cache": True},
    {"name": "attacker", "api_keys": [ATTACKER]},
]
SESSION = "chat-1"
ATTACKS = 8
"""Attacker requests of about 7 new blocks each: the whole cache churned one and a half times."""
WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "grove", "harbor", "island", "jasper"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path: Path = tmp_path_factory.mktemp("session-scoping")
    engine = start_engine(tmp_path, "--num-blocks", str(NUM_BLOCKS), "--max-model-len", "256")
    with running([engine]):
        config = gateway_config(free_port(), [engine], tenants=TENANTS)
        config["backends"][0]["retention_hints"] = True
        with gateway_for(tmp_path, config) as gateway:
            gateway.engine_url = engine.url  # type: ignore[attr-defined]
            yield gateway


def words(seed: int, count: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" for _ in range(count))


def send(gateway: ManagedProcess, key: str, messages: list[dict], headers: dict | None = None, **extra: object) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0, **extra}
    reply = http(
        "POST", f"{gateway.url}/v1/chat/completions", body, {"Authorization": f"Bearer {key}", **(headers or {})}
    )
    assert reply.status == 200, reply.body
    return reply.json()  # type: ignore[return-value]


def attack(gateway: ManagedProcess, vector: str) -> None:
    """One request naming the victim's session, then one-shots that churn the cache (a superseded
    turn is evicted before them); or a flood of sessions of the attacker's own."""
    for index in range(ATTACKS):
        messages = [{"role": "user", "content": words(1000 * index + len(vector), 25)}]
        if vector == "flood":
            send(gateway, ATTACKER, messages, {"x-session-id": f"flood-{index}"})
        elif index:
            send(gateway, ATTACKER, messages)
        elif vector == "header":
            send(gateway, ATTACKER, messages, {"x-session-id": SESSION})
        elif vector == "user":
            send(gateway, ATTACKER, messages, user=SESSION)
        else:
            send(gateway, ATTACKER, messages, kvgate_session=SESSION)


@pytest.mark.parametrize("vector", ["header", "user", "body", "flood"])
def test_the_victims_second_turn_stays_cached(gateway: ManagedProcess, vector: str) -> None:
    assert http("POST", f"{gateway.engine_url}/reset_prefix_cache", b"").status == 200  # type: ignore[attr-defined]
    messages = [{"role": "system", "content": words(7, 20)}, {"role": "user", "content": "Summarize."}]
    first = send(gateway, VICTIM, messages, {"x-session-id": SESSION})
    prompt = first["usage"]["prompt_tokens"]
    assert 4 * 16 <= prompt <= 7 * 16, prompt
    attack(gateway, vector)
    answer = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    messages += [answer, {"role": "user", "content": "And then?"}]
    second = send(gateway, VICTIM, messages, {"x-session-id": SESSION})
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt // 16 * 16
