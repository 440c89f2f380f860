"""Real engines with ``--device cuda`` on loopback: an aggregated engine serves greedy completions,
and a prefill and a decode engine move a prompt's KV between their GPU pools (the bundled
connector reads and writes device blocks) with the decode leg's output equal to the aggregated
engine's. Runs wherever ``torch.cuda.is_available()``; skipped (with the reason) elsewhere."""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from tests.engine.test_pd_engines import (
    BLOCK,
    CHAT,
    COMMON,
    MODEL,
    PROMPT,
    cached,
    connector,
    disaggregated,
    free_blocks,
    post,
    text_of,
)
from tests.procs import ManagedProcess, free_port, start_engine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ManagedProcess]]:
    tmp = tmp_path_factory.mktemp("cuda-engines")
    cuda = (*COMMON, "--device", "cuda")
    starts = {"prefill": (*cuda, *connector(free_port())), "decode": (*cuda, *connector()), "aggregated": cuda}
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = {name: pool.submit(start_engine, tmp, *flags, name=name) for name, flags in starts.items()}
        started = {name: future.result() for name, future in futures.items()}
    yield started
    for engine in started.values():
        engine.stop()


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": CHAT})]
)
def test_gpu_pools_hand_over_a_prefill_and_decode_equals_the_aggregated_engine(
    engines: dict[str, ManagedProcess], path: str, body: dict[str, Any]
) -> None:
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, **body}
    expected = post(engines["aggregated"], path, body)
    assert expected["usage"]["completion_tokens"] == 16
    _, decode = disaggregated(engines["prefill"], engines["decode"], path, body)
    full_blocks = (expected["usage"]["prompt_tokens"] - 1) // BLOCK
    assert text_of(decode) == text_of(expected)
    assert cached(decode) == full_blocks * BLOCK, "the pulled blocks count as cached"
    assert free_blocks(engines["prefill"]) == 200 and free_blocks(engines["decode"]) == 200
