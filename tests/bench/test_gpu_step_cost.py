"""The GPU step-cost micro-benchmark's decoder, on a CPU at toy sizes: a step writes the new
tokens' KV after the cached ones and returns one row of logits per sequence, and the shard of a
preset's model it builds is the planner's GPU, parameter for parameter."""

import pytest
import torch

from bench.micro.gpu_step_cost import (
    DENSE_SHAPES,
    Decoder,
    DenseShapes,
    Shapes,
    allreduce_ms,
    kv_caches,
    planner_parameters,
    shapes_of,
    step_ms,
)

TOY = Shapes(layers=2, heads=4, kv_heads=2, head_dim=8, dense=DenseShapes(hidden=32, intermediate=64, vocab=50))
CPU = torch.device("cpu")


@torch.inference_mode()
def test_a_step_writes_only_the_new_tokens_kv_and_returns_a_row_per_sequence() -> None:
    model = Decoder(TOY, CPU)
    caches = kv_caches(TOY, 2, 6 + 3, CPU)
    before = [(k.clone(), v.clone()) for k, v in caches]
    logits = model.forward(torch.randint(0, 50, (2, 3)), torch.arange(6, 9), caches)
    assert logits.shape == (2, 50) and torch.isfinite(logits).all()
    for (k, v), (k0, v0) in zip(caches, before, strict=True):
        assert torch.equal(k[:, :, :6], k0[:, :, :6]) and torch.equal(v[:, :, :6], v0[:, :, :6])
        assert not torch.equal(k[:, :, 6:], k0[:, :, 6:])


def test_step_ms_times_prefills_and_decodes() -> None:
    model = Decoder(TOY, CPU)
    assert step_ms(model, 1, 16, 8, CPU, repeats=1) > 0
    assert step_ms(model, 4, 1, 24, CPU, repeats=1) > 0


@pytest.mark.parametrize("preset", ["llama-3-8b-h200", "llama-3-70b-h200-tp4"])
def test_a_presets_shard_is_the_planners_gpu_parameter_for_parameter(preset: str) -> None:
    shapes = shapes_of(preset, None)
    dense = shapes.dense
    qkv = (shapes.heads + 2 * shapes.kv_heads) * shapes.head_dim
    per_layer = (
        dense.hidden * qkv + shapes.heads * shapes.head_dim * dense.hidden + 3 * dense.hidden * dense.intermediate
    )
    assert 2 * dense.vocab * dense.hidden + shapes.layers * per_layer == planner_parameters(preset, shapes.layers)


def test_one_gpu_of_a_tensor_parallel_group_holds_its_share_and_skips_the_all_reduces() -> None:
    whole = DENSE_SHAPES["llama-3-70b"]
    shard = shapes_of("llama-3-70b-h200-tp4", None)
    assert (shard.heads, shard.kv_heads, shard.dense.intermediate) == (64 // 4, 8 // 4, whole.intermediate // 4)
    assert allreduce_ms("llama-3-8b-h200") == 0
    assert allreduce_ms("llama-3-70b-h200-tp4") == pytest.approx(2 * 80 * 0.025)
