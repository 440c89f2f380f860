"""The matmul prefill attention against SDPA: causal with and without a cached prefix, sliding windows."""

import pytest
import torch
import torch.nn.functional as F

from engine.model.cpu_features import DISABLE_ONEDNN_BF16_ENV, probe_cpu
from engine.model.kernel_choice import choose_kernels
from engine.model.matmul_attention import TILE_ROWS, query_tiles, tiled_attention

HEADS, KV_HEADS, DIM = 9, 3, 64
CPU = torch.device("cpu")


def sdpa_reference(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start_pos: int, window: int | None
) -> torch.Tensor:
    """float32 SDPA with an explicit mask: query at ``p`` sees keys ``0 .. p`` (the last ``window`` of them)."""
    query_pos = torch.arange(start_pos, start_pos + query.shape[0])[:, None]
    key_pos = torch.arange(keys.shape[0])[None, :]
    visible = key_pos <= query_pos
    if window is not None:
        visible &= key_pos > query_pos - window
    return F.scaled_dot_product_attention(
        query.float()[None].transpose(1, 2),
        keys.float()[None].transpose(1, 2),
        values.float()[None].transpose(1, 2),
        attn_mask=visible,
        enable_gqa=True,
    )[0].transpose(0, 1)


@pytest.mark.parametrize(
    ("start_pos", "count", "window"),
    [
        (0, 1, None),
        (0, TILE_ROWS * 2 + 37, None),
        (1408, TILE_ROWS, None),
        (100, 5, None),
        (0, 300, 64),
        (500, 200, 100),
        (37, TILE_ROWS + 1, 50),
    ],
)
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_tiled_attention_equals_sdpa(
    start_pos: int, count: int, window: int | None, dtype: torch.dtype, tolerance: float
) -> None:
    generator = torch.Generator().manual_seed(start_pos * 1000 + count)
    context = start_pos + count
    query = torch.randn(count, HEADS, DIM, generator=generator).to(dtype)
    keys = torch.randn(context, KV_HEADS, DIM, generator=generator).to(dtype)
    values = torch.randn(context, KV_HEADS, DIM, generator=generator).to(dtype)
    out = tiled_attention(query, keys, values, query_tiles(start_pos, count, window, CPU, dtype))
    assert out.dtype == dtype and out.shape == query.shape
    expected = sdpa_reference(query, keys, values, start_pos, window)
    assert (out.float() - expected).abs().max().item() < tolerance


def test_tiles_touch_only_the_keys_their_queries_see() -> None:
    tiles = query_tiles(1000, TILE_ROWS * 2, None, CPU, torch.bfloat16)
    assert [(tile.key_begin, tile.key_end) for tile in tiles] == [(0, 1000 + TILE_ROWS), (0, 1000 + 2 * TILE_ROWS)]
    assert tiles[0].masked_from == 1001
    windowed = query_tiles(1000, TILE_ROWS, 64, CPU, torch.bfloat16)[0]
    assert windowed.key_begin == 1000 - 63


def test_cpu_float32_and_bfloat16_take_the_matmul_path_where_onednn_works() -> None:
    cpu = probe_cpu({})
    assert choose_kernels(CPU, torch.float32, cpu).matmul_prefill == cpu.onednn_float32
    assert choose_kernels(CPU, torch.bfloat16, cpu).matmul_prefill == cpu.onednn_bfloat16
    assert not choose_kernels(CPU, torch.bfloat16, probe_cpu({DISABLE_ONEDNN_BF16_ENV: "1"})).matmul_prefill
    assert not choose_kernels(CPU, torch.float16, cpu).matmul_prefill
    assert not choose_kernels(torch.device("cuda"), torch.bfloat16, None).matmul_prefill
