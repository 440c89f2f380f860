"""``prompt_cache_retention: "24h"`` through the openai SDK, a real gateway and a real bundled engine
running SmolLM2 whose default session TTL is 2 s (issue 29).

After the default TTL has passed and a flood of one-shot prompts has filled the cache, the 24 h
session's second turn is still served from cache, while the ``in_memory`` session's retention has
expired and its prefix was evicted with the one-shots.
"""

import time
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import openai
import pytest

from tests.gateway_cluster import gateway_config, gateway_for, running
from tests.procs import ManagedProcess, free_port, start_engine

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
DEFAULT_TTL_S = 2.0
ENGINE_FLAGS = ("--num-blocks", "64", "--max-model-len", "512", "--session-ttl-s", str(DEFAULT_TTL_S))
"""64 blocks of 16 tokens: a few one-shot prompts fill it, and half of it may be retained."""
LONG_SYSTEM = "Alpha team rules: answer briefly, cite the manual, never guess. " * 8
SHORT_SYSTEM = "Bravo desk notes: be kind, keep it short, and say thanks at the end. " * 8


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, ManagedProcess]]:
    tmp_path = tmp_path_factory.mktemp("cache-retention")
    with running([start_engine(tmp_path, *ENGINE_FLAGS)]) as engines:
        config = gateway_config(free_port(), engines, routing={"policy": "cache_aware"})
        with gateway_for(tmp_path, config) as gateway:
            yield openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0), engines[0]


def turn(
    client: openai.OpenAI, system: str, key: str, retention: Literal["in_memory", "24h"], follow_up: bool, **extra: Any
) -> int:
    """One greedy chat turn of the session ``key``; the prompt tokens the engine served from cache."""
    messages: list[Any] = [{"role": "system", "content": system}, {"role": "user", "content": "What is rule one?"}]
    if follow_up:
        messages += [{"role": "assistant", "content": "Be brief."}, {"role": "user", "content": "And rule two?"}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=1,
        temperature=0,
        prompt_cache_key=key,
        prompt_cache_retention=retention,
        **extra,
    )
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0


def retained_blocks(engine: ManagedProcess) -> int:
    return int(httpx.get(f"{engine.url}/stats").json()["retained_free_blocks"])


def flood(engine: ManagedProcess, count: int) -> None:
    """One-shot prompts (no session) straight to the engine, each about 25 blocks long."""
    for index in range(count):
        words = " ".join(f"item{index}-{word}" for word in range(80))
        reply = httpx.post(
            f"{engine.url}/v1/completions",
            json={"model": MODEL, "prompt": words, "max_tokens": 1},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text


def test_a_24h_session_outlives_the_default_ttl_and_an_in_memory_one_does_not(
    deployment: tuple[openai.OpenAI, ManagedProcess],
) -> None:
    client, engine = deployment
    assert turn(client, LONG_SYSTEM, "alpha", "24h", follow_up=False) == 0
    with_long = retained_blocks(engine)
    assert with_long > 0
    assert turn(client, SHORT_SYSTEM, "bravo", "in_memory", follow_up=False) == 0
    assert retained_blocks(engine) > with_long, "both sessions are retained at first"
    time.sleep(DEFAULT_TTL_S * 1.5)
    flood(engine, 4)
    assert retained_blocks(engine) == with_long, "only the 24 h session is still retained"
    assert turn(client, LONG_SYSTEM, "alpha", "24h", follow_up=True) >= 16 * (with_long - 1)
    assert turn(client, SHORT_SYSTEM, "bravo", "in_memory", follow_up=True) == 0


def test_an_unknown_retention_is_a_400_naming_it(deployment: tuple[openai.OpenAI, ManagedProcess]) -> None:
    client, _ = deployment
    with pytest.raises(openai.BadRequestError) as refused:
        turn(client, LONG_SYSTEM, "alpha", "24h", False, extra_body={"prompt_cache_retention": "1w"})
    assert refused.value.status_code == 400
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "prompt_cache_retention"
