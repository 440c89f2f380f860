"""Prefill attention built from batched matmuls, tile by tile of queries (CPU, bfloat16).

PyTorch's CPU flash-attention kernel runs a 1,536-token causal prefill at ~64 GFLOP/s on the
AVX512-BF16 EPYC we measure on, while a bfloat16 ``bmm`` runs 5-6x faster (``bench/VLLM.md``).
So for a chunk's queries, one tile of rows at a time: scores = Q·Kᵀ (one ``baddbmm`` per tile,
KV heads as the batch and each KV head's query heads stacked as rows, so GQA reads each key
once), masked where a query may not see a key, softmax (computed in float32 inside the kernel),
then ·V. A tile touches only the keys up to its last query (causality halves the work) and its
scores stay small enough for the cache.
"""

from dataclasses import dataclass

import torch

TILE_ROWS = 128
"""Query rows per tile. 64 and 128 cost the same on a 1,536-token prompt; 256 was 2-3x slower
(its scores no longer fit the cache) in ``/tmp`` micro-benchmarks, one thread, CPU time."""


@dataclass
class QueryTile:
    """Queries ``rows`` of a chunk see keys ``key_begin .. key_end - 1`` except where ``bias`` is -inf."""

    rows: slice
    key_begin: int
    key_end: int
    masked_from: int
    """First key column (absolute) that some query of the tile may not see; ``bias`` covers
    columns ``masked_from .. key_end - 1``."""
    bias: torch.Tensor | None
    """``[rows, key_end - masked_from]`` in the compute dtype: -inf where the query may not see the
    key, 0 elsewhere. Added to the scores: 3-4x cheaper than ``masked_fill_`` with a boolean mask
    broadcast over the heads."""


def query_tiles(
    start_pos: int, count: int, window: int | None, device: torch.device, dtype: torch.dtype
) -> list[QueryTile]:
    """Tiles for ``count`` queries at positions ``start_pos ..`` over keys ``0 .. start_pos + count - 1``.

    A query at position ``p`` sees keys ``0 .. p`` (and only the last ``window`` of them with a
    sliding window).
    """
    tiles = []
    for first in range(0, count, TILE_ROWS):
        last = min(count, first + TILE_ROWS)
        key_end = start_pos + last
        key_begin = 0 if window is None else max(0, start_pos + first - window + 1)
        query_pos = torch.arange(start_pos + first, key_end, device=device)[:, None]
        key_pos = torch.arange(key_begin, key_end, device=device)[None, :]
        hidden = key_pos > query_pos
        if window is not None:
            hidden |= key_pos <= query_pos - window
        partly = hidden.any(0).nonzero()
        masked_from = key_begin + int(partly[0]) if len(partly) else key_end
        bias = None
        if masked_from < key_end:
            tile_hidden = hidden[:, masked_from - key_begin :]
            bias = torch.zeros(tile_hidden.shape, dtype=dtype, device=device).masked_fill_(tile_hidden, float("-inf"))
        tiles.append(QueryTile(slice(first, last), key_begin, key_end, masked_from, bias))
    return tiles


def tiled_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tiles: list[QueryTile]
) -> torch.Tensor:
    """Attention of ``query`` ``[count, heads, dim]`` over ``keys``/``values`` ``[context, kv_heads, dim]``.

    Returns ``[count, heads, dim]``; the scale is SDPA's default, ``dim ** -0.5``.

    Q, K and V are first copied head-major (``[kv_heads, tokens, ...]``), once per call: then a
    tile's queries are one ``[kv_heads, rows * group, dim]`` view (row ``r``'s query heads are rows
    ``r * group ..``), and ``bmm`` reads K and V as plain matrices, which was 1.6x faster for Q·Kᵀ
    than over the strided token-major views.
    """
    count, heads, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    scale = dim**-0.5
    query_h = query.view(count, kv_heads, group, dim).transpose(0, 1).contiguous().view(kv_heads, count * group, dim)
    keys_h = keys.transpose(0, 1).contiguous()
    values_h = values.transpose(0, 1).contiguous()
    out = torch.empty_like(query)
    out_grouped = out.view(count, kv_heads, group, dim)
    zero = query.new_zeros(1, 1, 1)
    for tile in tiles:
        rows = tile.rows.stop - tile.rows.start
        width = tile.key_end - tile.key_begin
        tile_query = query_h[:, tile.rows.start * group : tile.rows.stop * group]
        scores = torch.baddbmm(
            zero.expand(kv_heads, group * rows, width),
            tile_query,
            keys_h[:, tile.key_begin : tile.key_end].transpose(1, 2),
            beta=0,
            alpha=scale,
        )
        if tile.bias is not None:
            scores.view(kv_heads, rows, group, width)[..., tile.masked_from - tile.key_begin :].add_(tile.bias[:, None])
        probs = torch.softmax(scores, dim=-1)
        attended = torch.bmm(probs, values_h[:, tile.key_begin : tile.key_end])
        out_grouped[tile.rows] = attended.view(kv_heads, rows, group, dim).transpose(0, 1)
    return out
