"""Prefill attention built from matmuls, tile by tile of queries (CPU, float32 and bfloat16, where
oneDNN works in that dtype: ``engine.model.kernel_choice``).

PyTorch's CPU flash-attention kernel runs a cached 128-token prefill over 1,536 keys at ~150
GFLOP/s in float32 and a 1,536-token causal one at ~64 GFLOP/s in bfloat16 on the AVX512-BF16
EPYC we measure on; in float32 its inner products go through MKL, while oneDNN runs the same
products at more than twice MKL's speed (``engine.model.onednn``). So for a chunk's queries, one tile
of rows at a time, each KV head's query heads stacked as rows (GQA reads each key once): scores =
Q·Kᵀ, masked where a query may not see a key, softmax (computed in float32 inside the kernel for
bfloat16), then ·V. A tile touches only the keys up to its last query (causality halves the
work) and its scores stay small enough for the cache.
"""

from dataclasses import dataclass

import torch

from engine.model.onednn import matmul_nt

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
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    tiles: list[QueryTile],
) -> torch.Tensor:
    """Attention of ``query`` ``[count, heads, dim]`` over ``keys``/``values`` ``[context, kv_heads, dim]``.

    Returns ``[count, heads, dim]``; the scale is SDPA's default, ``dim ** -0.5``. Q and K are
    first copied head-major (``[kv_heads, tokens, ...]``), once per call: then a tile's queries
    for one KV head are one ``[rows * group, dim]`` matrix (row ``r``'s query heads are rows
    ``r * group ..``) and its keys a contiguous ``[width, dim]`` one.

    float32 multiplies one KV head at a time with ``matmul_nt`` (oneDNN; MKL's float32 ``bmm`` is
    2-2.6x slower here). bfloat16 multiplies all KV heads at once with ``baddbmm``/``bmm``, which
    PyTorch already sends to oneDNN, 4-7% faster than per-head calls (``bench/VLLM.md``, measured
    with ``bench.engine.step_profile``).
    """
    count, heads, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    query_h = query.view(count, kv_heads, group, dim).transpose(0, 1).contiguous().view(kv_heads, count * group, dim)
    keys_h = keys.transpose(0, 1).contiguous()
    out = torch.empty_like(query)
    attend_tiles = _onednn_tiles if query.dtype == torch.float32 else _bmm_tiles
    attend_tiles(query_h, keys_h, values, tiles, out.view(count, kv_heads, group, dim))
    return out


def _onednn_tiles(
    query_h: torch.Tensor, keys_h: torch.Tensor, values: torch.Tensor, tiles: list[QueryTile], out: torch.Tensor
) -> None:
    """Each tile per KV head; V copied feature-major per tile (``[kv_heads, dim, width]``), the
    contiguous layout oneDNN needs for ·V (a strided one takes a path 1,000x slower)."""
    kv_heads, group, dim = keys_h.shape[0], out.shape[2], out.shape[3]
    query_h = query_h * dim**-0.5
    for tile in tiles:
        rows = tile.rows.stop - tile.rows.start
        width = tile.key_end - tile.key_begin
        values_t = values[tile.key_begin : tile.key_end].permute(1, 2, 0).contiguous()
        for head in range(kv_heads):
            tile_query = query_h[head, tile.rows.start * group : tile.rows.stop * group]
            scores = matmul_nt(tile_query, keys_h[head, tile.key_begin : tile.key_end])
            if tile.bias is not None:
                scores.view(rows, group, width)[..., tile.masked_from - tile.key_begin :].add_(tile.bias[:, None])
            probs = torch.softmax(scores, dim=-1)
            out[tile.rows, head] = matmul_nt(probs, values_t[head]).view(rows, group, dim)


def _bmm_tiles(
    query_h: torch.Tensor, keys_h: torch.Tensor, values: torch.Tensor, tiles: list[QueryTile], out: torch.Tensor
) -> None:
    """Each tile for all KV heads at once (KV heads as the batch)."""
    kv_heads, group, dim = keys_h.shape[0], out.shape[2], out.shape[3]
    values_h = values.transpose(0, 1).contiguous()
    zero = query_h.new_zeros(1, 1, 1)
    for tile in tiles:
        rows = tile.rows.stop - tile.rows.start
        width = tile.key_end - tile.key_begin
        scores = torch.baddbmm(
            zero.expand(kv_heads, group * rows, width),
            query_h[:, tile.rows.start * group : tile.rows.stop * group],
            keys_h[:, tile.key_begin : tile.key_end].transpose(1, 2),
            beta=0,
            alpha=dim**-0.5,
        )
        if tile.bias is not None:
            scores.view(kv_heads, rows, group, width)[..., tile.masked_from - tile.key_begin :].add_(tile.bias[:, None])
        probs = torch.softmax(scores, dim=-1)
        attended = torch.bmm(probs, values_h[:, tile.key_begin : tile.key_end])
        out[tile.rows] = attended.view(kv_heads, rows, group, dim).transpose(0, 1)
