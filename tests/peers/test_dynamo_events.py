"""The bundled engine's live KV events, read by NVIDIA Dynamo's KV router (issue 31).

A real ``kvgate engine --sim`` publishes its events; Dynamo's runtime-free ``select_service``
(``ai-dynamo-runtime``, in its own venv under the peers folder) subscribes to them and to the
replay socket, and must then report as overlap exactly the blocks the engine cached: a prompt sent
before it subscribed (learned through replay), a prompt sent after, and evictions.
"""

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from bench.harness.contenders import dynamo_install_hint, dynamo_python
from bench.harness.processes import Process
from bench.peers.dynamo_service import post_json, register_worker, start_select_service, worker_registration
from tests.procs import ManagedProcess, free_port, http, start_engine

MODEL = "smollm2-135m"
BLOCK = 16
NUM_BLOCKS = 16
PROMPT_TOKENS = 100
"""Six full blocks; with two output tokens the engine caches exactly those six."""
PROBE_AFTER_S = 3.0
"""How long Dynamo may take to show blocks whose event it received (it showed them within 0.1 s here)."""
DECODE_ERRORS = re.compile(r"Failed to decode|untagged enum|Replay failed|ERROR", re.IGNORECASE)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagedProcess, str, str]]:
    if not dynamo_python().exists():
        pytest.skip(dynamo_install_hint())
    tmp_path = tmp_path_factory.mktemp("dynamo-events")
    events, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    flags = ("--sim", "--sim-preset", "instant", "--num-blocks", str(NUM_BLOCKS), "--max-model-len", "256")
    process = start_engine(tmp_path, *flags, "--kv-events", events, "--kv-events-replay", replay)
    try:
        yield process, events, replay
    finally:
        process.stop()


@pytest.fixture(scope="module")
def select_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    if not dynamo_python().exists():
        pytest.skip(dynamo_install_hint())
    process = start_select_service(dynamo_python(), tmp_path_factory.mktemp("dynamo") / "select_service.log")
    try:
        yield process
    finally:
        process.stop()


def prompt(seed: int) -> list[int]:
    return [1000 + seed * 1000 + offset for offset in range(PROMPT_TOKENS)]


def complete(engine: ManagedProcess, token_ids: list[int], cache_salt: str | None = None) -> None:
    body: dict[str, object] = {"model": MODEL, "prompt": token_ids, "max_tokens": 2}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt  # its first block's event carries the salt in extra_keys
    reply = http("POST", f"{engine.url}/v1/completions", body)
    assert reply.status == 200, reply.body


def cached_blocks(engine: ManagedProcess) -> int:
    stats = http("GET", f"{engine.url}/stats").json()
    assert isinstance(stats, dict)
    return int(stats["cached_blocks"])


def overlap_blocks(service: Process, token_ids: list[int]) -> int:
    """The blocks of ``token_ids`` Dynamo believes worker 1 holds on its device."""
    answer = post_json(f"{service.url}/overlap_scores", {"model_name": MODEL, "token_ids": token_ids})
    assert isinstance(answer, dict)
    workers = {worker["worker_id"]: worker for worker in answer["workers"]}
    return int(workers[1]["device_blocks"]) if 1 in workers else 0


def probe(seed: int) -> list[int]:
    """A prompt of one full block (with two output tokens still one)."""
    return [40_000 + seed * 100 + offset for offset in range(BLOCK + 4)]


def seen(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_dynamo_reports_the_blocks_the_engine_cached(
    engine: tuple[ManagedProcess, str, str], select_service: Process
) -> None:
    process, events, replay = engine
    complete(process, prompt(0))  # published (sequence 0) before Dynamo subscribes: replay brings it
    assert cached_blocks(process) == 6
    register_worker(select_service.url, worker_registration(1, MODEL, process.url, BLOCK, events, replay))
    complete(process, prompt(1), cache_salt="tenant-a")
    assert cached_blocks(process) == 12
    prompts = [prompt(0), prompt(1)]
    expected = [6, 6]

    def overlaps() -> list[int]:
        return [overlap_blocks(select_service, token_ids) for token_ids in prompts]

    while not seen(lambda: overlaps() == expected, PROBE_AFTER_S):
        # The second prompt's event is lost when Dynamo's subscription had not joined yet (ZMQ's slow
        # joiner), and Dynamo asks the replay socket only on a gap in the sequence numbers: a
        # one-block prompt publishes the next number, and with it the gap.
        assert len(prompts) < 6, f"Dynamo never saw the prompts' blocks: {overlaps()} against {expected}"
        prompts.append(probe(len(prompts)))
        expected.append(1)
        complete(process, prompts[-1])
    selection = post_json(
        f"{select_service.url}/select_and_reserve",
        {"selection_id": "s1", "model_name": MODEL, "token_ids": prompt(1), "isl_tokens": PROMPT_TOKENS},
    )
    assert isinstance(selection, dict)
    assert selection["worker_id"] == 1 and selection["overlap"]["longest_matched"] == 6 * BLOCK
    assert http("DELETE", f"{select_service.url}/reservations/s1").status < 300

    complete(process, prompt(2))  # 16 blocks cannot hold 18: the third prompt evicts the first's tail
    prompts.append(prompt(2))
    held = cached_blocks(process)
    assert held < sum(expected) + 6, "the pool had to evict"

    def agrees() -> bool:
        reported = overlaps()
        return reported[-1] == 6 and sum(reported) == held

    wait_until(agrees, f"Dynamo's view {overlaps()} never matched the engine's {held} cached blocks")
    assert overlaps()[0] < 6, "the evicted blocks were removed from Dynamo's view"

    log = Path(select_service.log_path).read_text(errors="replace")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)
    assert not DECODE_ERRORS.search(plain), DECODE_ERRORS.findall(plain)
    assert "Replay complete" in plain, "the prompt sent before subscribing came through the replay socket"
    assert orjson.loads(http("GET", f"{select_service.url}/health").body)["status"] == "ok"
