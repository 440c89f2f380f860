"""dispatch.tokens_used: what a request is charged however it ended."""

import asyncio
from pathlib import Path

import orjson

from gateway.backends.proxy import UpstreamOutcome
from gateway.dispatch import tokens_used
from gateway.routing.types import RouteRequest
from protocol.usage import Usage
from tests.gateway.fake_replica import Behaviour, FakeReplica, chat, gateway, gateway_config, replicas

REQUEST = RouteRequest(request_id="r", model="m", block_hashes=[], prompt_tokens=900, max_tokens=8)


def test_a_request_a_replica_may_have_prefilled_is_charged_its_prompt() -> None:
    no_answer = UpstreamOutcome(status=0)
    assert tokens_used(REQUEST, no_answer, 908) == 0, "never reached a replica"
    assert tokens_used(REQUEST, no_answer, 908, prefill_started=True) == 900
    assert tokens_used(REQUEST, None, 908, prefill_started=True) == 900


def test_only_an_answer_the_replica_finished_teaches_the_router_how_long_answers_run() -> None:
    usage = Usage(prompt_tokens=900, completion_tokens=5, total_tokens=905)
    assert UpstreamOutcome(status=200, completed=True, usage=usage).completed_output_tokens == 5
    assert UpstreamOutcome(status=200, completed=False, usage=usage).completed_output_tokens is None, "client gone"
    assert UpstreamOutcome(status=200, completed=True, capped=True, usage=usage).completed_output_tokens is None
    assert UpstreamOutcome(status=400, completed=True, usage=usage).completed_output_tokens is None
    assert UpstreamOutcome(status=200, completed=True).completed_output_tokens is None, "no usage: length unknown"


def test_an_answer_is_charged_what_it_used_whatever_the_prefill_flag_says() -> None:
    streamed = UpstreamOutcome(status=200, first_token_at=1.0, token_chunks=3)
    assert tokens_used(REQUEST, streamed, 908, prefill_started=True) == 903
    usage = Usage(prompt_tokens=900, completion_tokens=2, total_tokens=902)
    answered = UpstreamOutcome(status=200, first_token_at=1.0, completed=True, usage=usage)
    assert tokens_used(REQUEST, answered, 908) == 902


async def test_a_request_every_replica_answered_5xx_is_charged_its_prompt_and_logged(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    tenants = [{"name": "t", "api_keys": ["key-t"], "tokens_per_minute": 10_000}]
    async with replicas(FakeReplica(Behaviour.FAIL_500), FakeReplica(Behaviour.FAIL_500)) as urls:
        config = gateway_config(urls, tenants=tenants, observability={"request_log_path": str(log)})
        async with gateway(config, None) as client:
            headers = {"Authorization": "Bearer key-t"}
            async with client.post("/v1/chat/completions", json=chat(), headers=headers) as reply:
                assert reply.status == 502, await reply.text()
            await asyncio.sleep(0)
    line = orjson.loads(log.read_text().splitlines()[0])
    assert line["status"] == "502" and line["charged_tokens"] > 0, "the prompt, though no answer came"
