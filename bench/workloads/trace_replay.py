"""Replay of a Mooncake request trace (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``).

Each 512-token hash id becomes a fixed block of ``block_tokens`` pseudo-random token ids seeded
by the id, so two requests whose ``hash_ids`` start alike share exactly that many blocks of
prompt prefix, as in production. Lengths scale by ``block_tokens / 512`` (a partial last block
stays partial) and timestamps are divided by ``time_compression``.

The published conversation trace writes its timestamps in steps of about 3 s (1,180 distinct
timestamps for 12,031 requests, every gap between them 2,997-3,003 ms), so replayed as written
each step's ten-odd requests arrive in one instant, and a replay in virtual time is the same run
whatever the seed. ``arrival_jitter_ms`` spreads each request over its step instead: its arrival
moves later by a uniform draw seeded by ``seed``, so seeds differ in arrival order and timing
within the trace's resolution, and simulated results get a spread to compare against.
"""

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.workloads.token_blocks import DEFAULT_VOCAB, seeded_block
from bench.workloads.types import BenchRequest

TRACE_BLOCK_TOKENS = 512
"""Tokens per hash id in the published traces."""


@dataclass(frozen=True)
class TraceReplayParams:
    trace_file: str = ""
    start: int = 0
    """First record of the window (0-based line of the trace): windows of one trace are ``start``
    = 0, 800, 1600, ... with the default ``max_requests``."""
    max_requests: int = 800
    """Records in the window; 0: all from ``start`` to the end of the trace."""
    block_tokens: int = 64
    """Tokens each 512-token hash id becomes (64: lengths scaled by 1/8)."""
    time_compression: float = 8.0
    max_prompt_tokens: int = 7936
    """Longer (scaled) prompts are cut here, keeping their prefix; the engines' context is 8,192."""
    max_output_tokens: int = 32
    seed: int = 0
    """Mixed into every block's seed, so different seeds give different (equally shaped) token ids;
    also seeds ``arrival_jitter_ms``."""
    arrival_jitter_ms: float = 0.0
    """Each arrival moves later by a uniform draw in [0, this) of trace milliseconds (before
    ``time_compression``): the trace's timestamp resolution, 3,000 for the conversation trace and
    1 for the synthetic one (module docstring). 0: arrivals exactly as written."""


def generate(params: TraceReplayParams, vocab: Sequence[int] = DEFAULT_VOCAB) -> list[BenchRequest]:
    if not params.trace_file:
        raise ValueError("trace replay needs trace_file")
    if params.arrival_jitter_ms < 0:
        raise ValueError("arrival_jitter_ms must be >= 0")
    records = read_trace(Path(params.trace_file), params.max_requests, params.start)
    blocks: dict[int, tuple[int, ...]] = {}
    first_timestamp = records[0]["timestamp"] if records else 0
    jitter = random.Random(params.seed)
    requests = []
    for index, record in enumerate(records):
        arrival_ms = record["timestamp"] - first_timestamp + jitter.uniform(0.0, params.arrival_jitter_ms)
        requests.append(
            BenchRequest(
                request_id=f"trace-{index}",
                session_id=f"trace-{index}",
                arrival_s=arrival_ms / 1000.0 / params.time_compression,
                max_tokens=max(1, min(params.max_output_tokens, _scaled(record["output_length"], params.block_tokens))),
                prompt_ids=trace_prompt(record, params, vocab, blocks),
            )
        )
    return sorted(requests, key=lambda request: request.arrival_s)


def read_trace(path: Path, max_requests: int, start: int = 0) -> list[dict]:
    """Records ``start`` .. ``start + max_requests - 1`` (to the end when ``max_requests`` is 0)."""
    records = []
    with path.open("rb") as lines:
        for line in itertools.islice((line for line in lines if line.strip()), start, None):
            records.append(orjson.loads(line))
            if len(records) == max_requests:
                break
    return records


def trace_prompt(
    record: dict, params: TraceReplayParams, vocab: Sequence[int], blocks: dict[int, tuple[int, ...]]
) -> tuple[int, ...]:
    """The record's prompt: its hash ids' blocks concatenated, cut at the scaled input length."""
    length = min(_scaled(record["input_length"], params.block_tokens), params.max_prompt_tokens)
    prompt: list[int] = []
    for hash_id in record["hash_ids"]:
        if len(prompt) >= length:
            break
        if hash_id not in blocks:
            blocks[hash_id] = seeded_block(hash_id * 1_000_003 + params.seed, params.block_tokens, vocab)
        prompt.extend(blocks[hash_id])
    return tuple(prompt[:length])


def _scaled(tokens: int, block_tokens: int) -> int:
    return max(1, math.ceil(tokens * block_tokens / TRACE_BLOCK_TOKENS))
