"""CPU of each stage of the gateway's chat request path, in process, on the overhead workload.

The stages the handler runs between reading a body and forwarding it (parse, normalize, render,
tokenize, hash, route, index insert, ...), timed one request after another with the thread's CPU
clock on the overhead benchmark's chats (2,048 tokens by default; 16 system prompts, a fresh question each).
No HTTP: what aiohttp, the upstream call and the telemetry cost is what ``bench.micro.overhead_ab``
measures beyond the sum printed here. The first ``--warm-up`` requests are not counted.

    python -m bench.micro.request_stages [--requests 1500]
"""

import argparse
import asyncio
import gc
import statistics
import time

import orjson

from bench.harness.contenders import MODEL
from bench.micro.overhead import chat_bodies
from gateway.admission.forwarded_body import forwarded_body
from gateway.admission.input_limits import check_input, check_raw_body
from gateway.admission.tenants import NO_CAPS
from gateway.config import KvgateConfig
from gateway.openai_request import Endpoint, parse_request
from gateway.routing.types import RouteRequest
from gateway.wiring.state import Gateway
from normalize.chat_tokenizer import ChatTokenizer


class StageClock:
    """CPU nanoseconds per stage, one list entry per request."""

    def __init__(self) -> None:
        self.samples: dict[str, list[int]] = {}
        self._last = time.thread_time_ns()

    def start(self) -> None:
        self._last = time.thread_time_ns()

    def lap(self, stage: str) -> None:
        now = time.thread_time_ns()
        self.samples.setdefault(stage, []).append(now - self._last)
        self._last = now


async def run(requests: int, warm_up: int, prompt_tokens: int = 2048) -> StageClock:
    config = KvgateConfig.model_validate(
        {
            "model": MODEL,
            "tokenizer": MODEL,
            "backends": [{"name": "zero", "url": "http://127.0.0.1:9", "kv_capacity_blocks": 1_000_000}],
            "routing": {"policy": "cache_aware"},
        }
    )
    gateway = Gateway.build(config)
    model = gateway.models.resolve(MODEL).served
    backend = gateway.pool.backends["zero"]
    bodies = chat_bodies(ChatTokenizer.load(MODEL), warm_up + requests, prompt_tokens)
    gc.collect()
    gc.freeze()
    clock = StageClock()
    for index, raw in enumerate(bodies):
        if index == warm_up:
            clock.samples.clear()
        clock.start()
        check_raw_body(raw, config.limits)
        parsed = parse_request(orjson.loads(raw), Endpoint.CHAT)
        clock.lap("read and parse (orjson, pydantic)")
        check_input(parsed.body, config.limits)
        normalized = model.normalizer.apply(parsed.body)
        clock.lap("check input and normalize")
        bound = gateway.limits.prompt_bound(model.name, NO_CAPS)
        prompt = (await model.token_ids(normalized.body, parsed, None, bound.check))[0]
        clock.lap("render and tokenize")
        grant = gateway.limits.check(model.name, NO_CAPS, len(prompt.ids), parsed.max_tokens, 256)
        orjson.dumps(forwarded_body(normalized.body, grant, None))
        clock.lap("caps and forwarded body")
        hashes = model.hash_memo.block_hashes(prompt, config.block_size, model.name)
        clock.lap("block hashes")
        route = RouteRequest(f"gw-{index}", model.name, hashes, len(prompt.ids), grant.max_tokens, token_ids=prompt.ids)
        ticket = gateway.router.route(route, [backend.state()])
        clock.lap("route")
        gateway.router.on_routed(ticket, backend.name)
        clock.lap("index insert (on_routed)")
        gateway.router.on_finished(ticket, None, prefilled=True)
    await gateway.session.close()
    return clock


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.request_stages", description=__doc__)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--warm-up", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=2048, help="tokens of each chat (16 system prompts)")
    args = parser.parse_args(argv)
    clock = asyncio.run(run(args.requests, args.warm_up, args.prompt_tokens))
    print("| stage | median (us) | mean (us) |\n|---|---|---|")
    for stage, samples in clock.samples.items():
        print(f"| {stage} | {statistics.median(samples) / 1e3:.1f} | {statistics.mean(samples) / 1e3:.1f} |")
    total = [sum(stage[i] for stage in clock.samples.values()) for i in range(args.requests)]
    print(f"| all of them | {statistics.median(total) / 1e3:.1f} | {statistics.mean(total) / 1e3:.1f} |")


if __name__ == "__main__":
    main()
