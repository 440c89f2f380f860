"""The runner's sampler: greedy, temperature / top-k / top-p, and reproducible seeded draws."""

import torch

from engine.model.runner_api import SamplingParams
from engine.model.sampler import Sampler

SAMPLER = Sampler(torch.device("cpu"))
THREE_TOKENS = torch.tensor([0.5, 0.3, 0.2]).log()


def draw(params: SamplingParams, rows: int, logits: torch.Tensor = THREE_TOKENS, step: int = 0) -> list[int]:
    return SAMPLER(logits.expand(rows, -1).clone(), [params] * rows, [step] * rows)


def frequencies(tokens: list[int], vocab: int) -> list[float]:
    return (torch.bincount(torch.tensor(tokens), minlength=vocab).float() / len(tokens)).tolist()


def test_greedy_is_argmax_per_row() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    assert SAMPLER(logits, [SamplingParams(temperature=0.0)] * 2, [0, 0]) == [1, 0]


def test_draws_follow_the_distribution() -> None:
    observed = frequencies(draw(SamplingParams(temperature=1.0), 8000), 3)
    assert all(abs(seen - want) < 0.03 for seen, want in zip(observed, [0.5, 0.3, 0.2], strict=False))


def test_top_k_and_top_p_cut_the_tail() -> None:
    assert set(draw(SamplingParams(top_k=2), 2000)) == {0, 1}
    assert set(draw(SamplingParams(top_p=0.6), 2000)) == {0, 1}
    assert set(draw(SamplingParams(temperature=5.0, top_k=1), 200)) == {0}
    assert set(draw(SamplingParams(temperature=5.0, top_p=0.01), 200)) == {0}


def test_low_temperature_sharpens() -> None:
    assert frequencies(draw(SamplingParams(temperature=0.1), 2000), 3)[0] > 0.95


def test_seeded_draws_repeat_per_step_and_vary_across_steps_and_seeds() -> None:
    flat = torch.zeros(1000)
    seeded = SamplingParams(seed=7)
    per_step = [draw(seeded, 1, flat, step)[0] for step in range(20)]
    assert per_step == [draw(seeded, 1, flat, step)[0] for step in range(20)]
    assert len(set(per_step)) > 10
    other_seed = [draw(SamplingParams(seed=8), 1, flat, step)[0] for step in range(20)]
    assert other_seed != per_step


def test_greedy_and_sampled_rows_mix_in_one_batch() -> None:
    logits = torch.stack([THREE_TOKENS, torch.zeros(3), THREE_TOKENS])
    params = [SamplingParams(temperature=0.0), SamplingParams(seed=3), SamplingParams(temperature=0.0)]
    tokens = SAMPLER(logits, params, [0, 5, 0])
    assert tokens[0] == tokens[2] == 0
    assert tokens[1] == SAMPLER(torch.zeros(1, 3), [SamplingParams(seed=3)], [5])[0]
