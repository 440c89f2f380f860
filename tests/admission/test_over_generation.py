"""A backend that ignores max_tokens in a non-streamed answer: the gateway cannot cut what was
already generated, so it charges the tenant's token budget with the real usage and counts the
excess in `kvgate_over_cap_completion_tokens_total` and the request log."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.fake_replica import PROMPT_TOKENS, FakeReplica, chat, gateway, gateway_config, replicas

GENERATED = 1000
BUDGET = 300


@dataclass
class RunawayReplica(FakeReplica):
    """Answers every request with GENERATED completion tokens, whatever max_tokens says."""

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": GENERATED,
            "total_tokens": PROMPT_TOKENS + GENERATED,
        }


async def test_generation_past_the_grant_is_charged_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    tenants = [{"name": "metered", "api_keys": ["key-metered"], "tokens_per_minute": BUDGET}]
    headers = {"Authorization": "Bearer key-metered"}
    async with replicas(RunawayReplica()) as urls:
        config = gateway_config(urls, tenants=tenants, observability={"request_log_path": str(log)})
        async with gateway(config, None) as client:
            async with client.post("/v1/chat/completions", json=chat(max_tokens=5), headers=headers) as reply:
                assert reply.status == 200
                assert (await reply.json())["usage"]["completion_tokens"] == GENERATED, "relayed as generated"
            async with client.post("/v1/chat/completions", json=chat(max_tokens=5), headers=headers) as reply:
                refusal = await reply.json()
                assert reply.status == 429, "the budget is in debt for what was really used"
                assert refusal["error"]["code"] == "tokens_per_minute_exceeded"
            async with client.get("/metrics") as reply:
                metrics = await reply.text()
    over = [
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "kvgate_over_cap_completion_tokens_total"
    ]
    assert over == [GENERATED - 5]
    served = orjson.loads(log.read_text().splitlines()[0])
    assert served["completion_tokens"] == GENERATED and served["over_cap_tokens"] == GENERATED - 5
