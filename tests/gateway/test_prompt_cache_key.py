"""OpenAI's ``prompt_cache_key`` and configurable session headers as routing and retention keys,
through the openai SDK to a gateway in front of two simulated engines (real processes on loopback).

As documented (docs/routing.md): under ``cache_aware`` a key is a session (footprints, retention)
and the shared prefix decides where requests go, so two users with the same long prefix and
different keys stay together; under ``policy: session`` each key sticks to its ring owner, so
different keys are kept apart. Either way the route reason ends in ``+cache-key``.
"""

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_cluster import INSTANT_SIM, MODEL, gateway_with_engines
from tests.procs import start_engine

pytestmark = pytest.mark.slow

SYSTEM = "You are the support assistant of a large hardware store. " * 40
"""A long shared prefix (several hundred tokens)."""


def ask(client: openai.OpenAI, user: str, **extra: Any) -> tuple[str, str]:
    """One chat turn; the backend that answered it and the route reason."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"I am {user}. Hello!"}],
        max_tokens=4,
        **extra,
    )
    return raw.headers["x-kvgate-backend"], raw.headers["x-kvgate-route-reason"]


def under_load(client: openai.OpenAI, keys: list[str], per_key: int) -> dict[str, Counter[str]]:
    """``per_key`` concurrent requests for each key, interleaved: the backends each key went to."""
    jobs = [key for _ in range(per_key) for key in keys]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda key: (key, *ask(client, key, prompt_cache_key=key)), jobs))
    spread: dict[str, Counter[str]] = {key: Counter() for key in keys}
    for key, backend, reason in answers:
        assert reason.endswith("+cache-key"), reason
        spread[key][backend] += 1
    return spread


@pytest.fixture(scope="module")
def session_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    routing = {"policy": "session", "session_headers": ["x-session-id", "x-claude-code-session-id"]}
    with gateway_with_engines(tmp_path_factory.mktemp("session"), (INSTANT_SIM, INSTANT_SIM), routing=routing) as gw:
        yield openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)


def test_session_policy_keeps_each_key_on_one_replica_and_different_keys_apart(
    session_gateway: openai.OpenAI,
) -> None:
    owners: dict[str, str] = {}
    for index in range(32):
        key = f"user-{index}"
        owners[key] = ask(session_gateway, key, prompt_cache_key=key)[0]
        if len(set(owners.values())) == 2:
            break
    apart = [next(key for key in owners if owners[key] == backend) for backend in sorted(set(owners.values()))]
    assert len(apart) == 2, "no two keys found on different replicas"
    spread = under_load(session_gateway, apart, per_key=12)
    for key in apart:
        assert spread[key] == Counter({owners[key]: 12}), spread


def test_a_session_header_names_the_same_session_as_the_cache_key(session_gateway: openai.OpenAI) -> None:
    backend, reason = ask(session_gateway, "carol", prompt_cache_key="carol-key")
    for _ in range(3):
        via_header = session_gateway.with_options(default_headers={"x-claude-code-session-id": "carol-key"})
        header_backend, header_reason = ask(via_header, "carol")
        assert header_backend == backend
        assert header_reason == "session"
    assert reason == "session+cache-key"


def test_cache_aware_keeps_same_prefix_users_together(tmp_path: Path) -> None:
    with gateway_with_engines(tmp_path, (INSTANT_SIM, INSTANT_SIM), routing={"policy": "cache_aware"}) as gateway:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
        first, _ = ask(client, "warm-up", prompt_cache_key="warm-up")
        for key in ("alice", "bob", "alice", "bob"):
            backend, reason = ask(client, key, prompt_cache_key=key)
            assert (backend, reason) == (first, "prefix-hit+cache-key")


@pytest.mark.parametrize(
    ("extra", "status", "param"),
    [
        ({"prompt_cache_key": 7}, 400, "prompt_cache_key"),
        ({"prompt_cache_retention": "forever"}, 400, "prompt_cache_retention"),
        ({"prompt_cache_retention": 24}, 400, "prompt_cache_retention"),
        ({"kvgate_session_ttl_s": -1}, 400, "kvgate_session_ttl_s"),
    ],
)
def test_bad_cache_fields_get_a_400_naming_them(
    session_gateway: openai.OpenAI, extra: dict[str, Any], status: int, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(session_gateway, "dave", extra_body=extra)
    assert refused.value.status_code == status
    assert refused.value.body["param"] == param


def test_in_memory_retention_is_accepted(session_gateway: openai.OpenAI) -> None:
    backend, reason = ask(
        session_gateway, "erin", prompt_cache_key="erin", extra_body={"prompt_cache_retention": "in_memory"}
    )
    assert reason == "session+cache-key" and backend
    assert httpx.get(str(session_gateway.base_url).removesuffix("/v1/") + "/health").status_code == 200


def test_straight_to_an_engine_the_cache_key_is_its_session(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *INSTANT_SIM)
    try:
        client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello!"}]

        def create(**extra: Any) -> None:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, **extra)  # type: ignore[arg-type]

        assert httpx.get(f"{engine.url}/stats").json()["retained_free_blocks"] == 0
        create(prompt_cache_key="frank", extra_body={"prompt_cache_retention": "in_memory"})
        assert httpx.get(f"{engine.url}/stats").json()["retained_free_blocks"] > 0
        refusals = [
            ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
            ({"kvgate_session_ttl_s": 0}, "kvgate_session_ttl_s"),
            ({"prompt_cache_key": ""}, "prompt_cache_key"),
        ]
        for extra, param in refusals:
            with pytest.raises(openai.BadRequestError) as refused:
                create(extra_body=extra)
            assert refused.value.body["param"] == param
    finally:
        engine.stop()
