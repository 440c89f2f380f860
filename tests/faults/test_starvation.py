"""A tenant pushing oversized prompts does not starve another tenant's small requests (issue 18.4).

Hostile senders each post ~7 MB chat bodies (seven distinct messages of a million characters:
within every shape limit, far over the model's context) for as long as the victim measures.
Tokenizing them took seconds each, and their segments flushed the tokenizer cache, so the
victim's requests waited on the hostile ones. The gateway must refuse them before tokenizing,
and the victim's small requests keep a median latency within MAX_SLOWDOWN times the median the
same victim requests took just before, without the hostile load (measured in the test, so that
a busy machine slows both alike; a victim starved again waits seconds). The hostile load is real
but bounded: four senders, each pausing PAUSE_S between requests (flat out, the senders and
the gateway parsing 7 MB bodies compete for this 2-core machine's CPU, not for the tokenizer).
"""

import asyncio
import statistics
import time
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from tests.gateway_cluster import MODEL, chat, gateway_with_engines
from tests.procs import ManagedProcess

HOSTILE, VICTIM = "key-hostile", "key-victim"
TENANTS = [
    {"name": "hostile", "api_keys": [HOSTILE], "max_concurrency": 2},
    {"name": "victim", "api_keys": [VICTIM], "max_concurrency": 2},
]
SENDERS = 4
PAUSE_S = 0.2
VICTIM_REQUESTS = 30
MAX_SLOWDOWN = 20.0
"""The victim's median latency under the hostile load, at most this many times its median without it."""
VICTIM_TIMEOUT_S = 5.0
"""A victim request not answered by then counts as taking this long (a starved gateway fails fast)."""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    with gateway_with_engines(tmp_path_factory.mktemp("starvation"), tenants=TENANTS) as gateway:
        yield gateway


FILLER = "lorem ipsum dolor sit amet, " * 35_700


def oversized_body(sender: int, request: int) -> bytes:
    """Seven messages of a million characters, none seen before."""
    messages = [
        {"role": "system" if index == 0 else "user", "content": f"{sender}.{request}.{index} {FILLER}"}
        for index in range(7)
    ]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 1})


def question(index: int) -> str:
    """A small request about a short document of its own (long enough to be tokenized off the loop)."""
    return f"Document {index}: " + " ".join(f"clause {index}.{line} applies" for line in range(150)) + " Summarize it."


async def push(session: aiohttp.ClientSession, url: str, sender: int, stop: asyncio.Event) -> list[int]:
    statuses = []
    while not stop.is_set():
        body = oversized_body(sender, len(statuses))
        async with session.post(url, data=body, headers={"Authorization": f"Bearer {HOSTILE}"}) as reply:
            await reply.read()
            statuses.append(reply.status)
        await asyncio.sleep(PAUSE_S)
    return statuses


async def victim_latencies(session: aiohttp.ClientSession, url: str, first: int) -> list[float]:
    """Seconds each of VICTIM_REQUESTS small requests took, one after another (questions first, first + 1...)."""
    victim = {"Authorization": f"Bearer {VICTIM}"}
    latencies = []
    for index in range(first, first + VICTIM_REQUESTS):
        started = time.perf_counter()
        try:
            async with asyncio.timeout(VICTIM_TIMEOUT_S):
                async with session.post(url, json=chat(question(index), 1), headers=victim) as reply:
                    await reply.read()
                    assert reply.status == 200
        except TimeoutError:
            pass
        latencies.append(time.perf_counter() - started)
    return latencies


async def test_oversized_prompts_do_not_starve_another_tenant(gateway: ManagedProcess) -> None:
    url = f"{gateway.url}/v1/chat/completions"
    stop = asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.post(url, json=chat("warm up", 1), headers={"Authorization": f"Bearer {VICTIM}"}) as reply:
            assert reply.status == 200
        alone = statistics.median(await victim_latencies(session, url, first=VICTIM_REQUESTS))
        pushers = [asyncio.create_task(push(session, url, sender, stop)) for sender in range(SENDERS)]
        await asyncio.sleep(0.5)
        latencies = await victim_latencies(session, url, first=0)
        stop.set()
        refused = [status for statuses in await asyncio.gather(*pushers) for status in statuses]
    assert 400 in refused and set(refused) <= {400, 429}
    p50 = statistics.median(latencies)
    assert p50 < MAX_SLOWDOWN * alone, (
        f"victim p50 {p50 * 1000:.0f} ms under the hostile load, {alone * 1000:.0f} ms without it, "
        f"while {len(refused)} oversized prompts were refused"
    )
