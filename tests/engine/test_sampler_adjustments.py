"""Penalties, logit bias and logprobs in the sampler, against values worked out by hand."""

import torch

from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.model.runner_api import SamplingParams, SeqChunk
from engine.model.sampler import apply_penalties, token_logprobs
from engine.sim.sim_runner import SIM_PRESETS, SimRunner


def chunk(params: SamplingParams, outputs: list[int]) -> SeqChunk:
    return SeqChunk(0, [1], 5, [0], True, params, len(outputs), outputs)


def test_penalties_count_generated_tokens_and_bias_adds_to_one_token() -> None:
    logits = torch.zeros(2, 5)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={4: 3.0})
    adjusted = apply_penalties(logits, [chunk(params, [1, 1, 2]), chunk(SamplingParams(), [1])])
    assert adjusted[0].tolist() == [0.0, -(0.5 + 2 * 0.25), -(0.5 + 0.25), 0.0, 3.0]
    assert adjusted[1].tolist() == [0.0] * 5, "a row without penalties is untouched"
    assert logits.abs().sum() == 0, "the raw logits (for logprobs) are not changed in place"


def test_logprobs_are_the_raw_log_softmax_with_the_top_k_in_order() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    found = token_logprobs(logits, [2], [2])[0]
    expected = torch.log_softmax(logits[0], dim=-1)
    assert found.token_id == 2 and abs(found.logprob - expected[2].item()) < 1e-6
    assert [token for token, _ in found.top] == [1, 2]
    assert abs(found.top[0][1] - expected[1].item()) < 1e-6
    assert token_logprobs(logits, [0], [0])[0].top == []


def test_the_scheduler_hands_generated_tokens_only_to_penalized_sequences() -> None:
    scheduler = Scheduler(BlockManager(16, 4, "test-model"), 8, 64)
    penalized = SamplingParams(temperature=0.0, max_tokens=4, frequency_penalty=1.0)
    seqs = [Sequence(0, [1, 2, 3], penalized, 64), Sequence(1, [1, 2, 3], SamplingParams(temperature=0.0), 64)]
    for seq in seqs:
        scheduler.add(seq)
    runner = SimRunner(4, 16, SIM_PRESETS["instant"], [7, 8, 9])
    for _ in range(3):
        step = scheduler.schedule()
        scheduler.postprocess(step, runner.execute(step.chunks))
    chunks = scheduler.schedule().chunks
    assert chunks[0].output_token_ids == seqs[0].output_token_ids and len(chunks[0].output_token_ids) == 3
    assert chunks[1].output_token_ids == []
