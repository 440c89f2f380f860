"""Cross-tenant LoRA KV poisoning through a crafted cache salt, end to end on the real model (issue 28,
finding 3).

The block-hash root joined model, salt and adapter with NUL, so a base-model request salted
``"\\0lora\\0ad"`` cached blocks under the root of an unsalted request for adapter ``ad``: the
adapter's next user got base-model KV (``cached_tokens`` 64 of 65) and base-model text. Here a
gateway fronts the real SmolLM2 serving adapter ``ad``; an attacker (an open tenant, whose salt
passes through) sends the crafted prompts first, and each victim must find nothing cached and get
the adapter's own answer.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.gateway_cluster import MODEL, gateway_config, gateway_for, running
from tests.lora_adapter import make_lora_adapter
from tests.procs import ManagedProcess, free_port, http, start_engine

ADAPTER = "ad"
PROMPT = (
    "Summarize the following maintenance log for the night shift supervisor, listing each machine, "
    "the fault it reported, the part that was replaced and whether a follow-up visit is needed: "
    "press 4 hydraulic leak seal replaced no follow-up; lathe 2 spindle noise bearing replaced follow-up Friday."
)


@dataclass
class Deployment:
    gateway: ManagedProcess
    engine: ManagedProcess

    def reset_cache(self) -> None:
        assert http("POST", f"{self.engine.url}/reset_prefix_cache").status == 200


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp_path = tmp_path_factory.mktemp("salt-lora")
    adapter = make_lora_adapter(tmp_path / ADAPTER, seed=5, scale=0.5)
    flags = (
        "--num-blocks",
        "128",
        "--max-model-len",
        "512",
        "--threads",
        "1",
        "--lora-modules",
        f"{ADAPTER}={adapter}",
    )
    with (
        running([start_engine(tmp_path, *flags)]) as engines,
        gateway_for(tmp_path, gateway_config(free_port(), engines)) as gateway,
    ):
        deadline = time.monotonic() + 30
        while ADAPTER not in {card["id"] for card in http("GET", f"{gateway.url}/v1/models").json()["data"]}:  # type: ignore[index]
            assert time.monotonic() < deadline, "the gateway never listed the adapter"
            time.sleep(0.1)
        yield Deployment(gateway, engines[0])


def complete(deployment: Deployment, model: str, salt: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    reply = http("POST", f"{deployment.gateway.url}/v1/completions", body)
    assert reply.status == 200, reply.body
    answer: Any = reply.json()
    return answer


def fresh_answer(deployment: Deployment, model: str, salt: str | None) -> str:
    """What ``model`` answers on an empty cache."""
    deployment.reset_cache()
    answer = complete(deployment, model, salt)
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    return str(answer["choices"][0]["text"])


@pytest.mark.parametrize(
    ("attacker", "victim"),
    [
        ((MODEL, "\x00lora\x00" + ADAPTER), (ADAPTER, None)),
        ((MODEL, "team\x00lora\x00" + ADAPTER), (ADAPTER, "team")),
        ((ADAPTER, None), (MODEL, "\x00lora\x00" + ADAPTER)),
    ],
    ids=["base-salted-poisons-adapter", "salted-variant", "adapter-poisons-base"],
)
def test_a_crafted_salt_never_shares_blocks_with_another_model_or_adapter(
    deployment: Deployment, attacker: tuple[str, str | None], victim: tuple[str, str | None]
) -> None:
    expected = fresh_answer(deployment, *victim)
    other_model = MODEL if victim[0] == ADAPTER else ADAPTER
    assert expected != fresh_answer(deployment, other_model, None), "the adapter changes the answer"
    deployment.reset_cache()
    complete(deployment, *attacker)
    answer = complete(deployment, *victim)
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert answer["choices"][0]["text"] == expected
    again = complete(deployment, *victim)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "the victim's own blocks still hit"
