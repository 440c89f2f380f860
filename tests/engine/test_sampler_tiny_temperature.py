"""A temperature too small to divide by samples greedily (vLLM's rule), never NaN and token 0."""

import pytest
import torch

from engine.model.runner_api import SamplingParams
from engine.model.sampler import GREEDY_BELOW, Sampler


@pytest.mark.parametrize("temperature", [1e-300, 1e-30, GREEDY_BELOW / 2])
def test_a_vanishing_temperature_picks_the_most_likely_token(temperature: float) -> None:
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0], [3.0, 9.0, 1.0, 0.5]])
    params = [SamplingParams(temperature=temperature), SamplingParams(temperature=temperature, top_p=0.5, seed=3)]
    for _ in range(20):
        assert Sampler(torch.device("cpu"))(logits, params, [0, 0]) == [2, 1]


def test_a_small_but_usable_temperature_still_samples() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    picks = {
        Sampler(torch.device("cpu"))(logits, [SamplingParams(temperature=GREEDY_BELOW)], [0])[0] for _ in range(60)
    }
    assert len(picks) > 1, "uniform logits at a temperature of 1e-5 are still drawn at random"
