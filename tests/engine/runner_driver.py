"""A minimal scheduler for driving a ModelRunner directly in tests.

It hands out blocks from a free list, feeds prompts in chunks, decodes every sequence whose
prompt is done, and lets sequences arrive on later steps so one ``execute`` call mixes prefill
chunks with decodes. No prefix cache: a test passes ``reuse`` to start a sequence on blocks an
earlier one filled.
"""

from dataclasses import dataclass, field

from engine.model.runner_api import ModelRunner, SamplingParams, SeqChunk

GREEDY = SamplingParams(temperature=0.0)


@dataclass
class DrivenSeq:
    seq_id: int
    prompt: list[int]
    arrival_step: int
    block_table: list[int]
    computed: int
    output: list[int] = field(default_factory=list)


@dataclass
class DriveResult:
    outputs: list[list[int]]
    block_tables: list[list[int]]
    mixed_steps: int
    """Steps whose ``execute`` call held both a multi-token prefill chunk and a decode."""


def generate(
    runner: ModelRunner,
    prompts: list[list[int]],
    max_tokens: int,
    chunk_size: int = 1 << 30,
    arrive_every: int = 0,
    reuse: list[tuple[list[int], int]] | None = None,
    sampling: SamplingParams = GREEDY,
    free_blocks: list[int] | None = None,
) -> DriveResult:
    """Generate ``max_tokens`` per prompt; ``reuse[i]`` = (filled blocks, tokens they hold) for prompt i."""
    free = list(range(runner.num_blocks)) if free_blocks is None else free_blocks
    seqs = []
    for index, prompt in enumerate(prompts):
        blocks, cached = reuse[index] if reuse else ([], 0)
        seqs.append(DrivenSeq(index, prompt, index * arrive_every, list(blocks), cached))
    step = mixed_steps = 0
    while any(len(seq.output) < max_tokens for seq in seqs):
        active = [seq for seq in seqs if seq.arrival_step <= step and len(seq.output) < max_tokens]
        chunks = [_next_chunk(seq, chunk_size, runner.block_size, free, sampling) for seq in active]
        kinds = {len(chunk.token_ids) > 1 for chunk in chunks}
        mixed_steps += kinds == {True, False}
        for seq, chunk, token in zip(active, chunks, runner.execute(chunks), strict=False):
            seq.computed = chunk.start_pos + len(chunk.token_ids)
            assert (token is not None) == chunk.sample
            if token is not None:
                seq.output.append(token)
        step += 1
    return DriveResult([seq.output for seq in seqs], [seq.block_table for seq in seqs], mixed_steps)


def _next_chunk(
    seq: DrivenSeq, chunk_size: int, block_size: int, free: list[int], sampling: SamplingParams
) -> SeqChunk:
    tokens = (
        seq.prompt[seq.computed : seq.computed + chunk_size] if seq.computed < len(seq.prompt) else [seq.output[-1]]
    )
    end = seq.computed + len(tokens)
    while len(seq.block_table) * block_size < end:
        seq.block_table.append(free.pop())
    sample = end >= len(seq.prompt)
    return SeqChunk(seq.seq_id, tokens, seq.computed, list(seq.block_table), sample, sampling, len(seq.output))
