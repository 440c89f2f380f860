"""Attention over the paged KV cache with PyTorch's ``scaled_dot_product_attention``.

A step's tokens are packed flat: first one token per single-token chunk (decodes, attended in
one batched call, keys padded to the longest context and masked), then each multi-token chunk
(prefill, attended one chunk at a time). A query at position ``p`` sees keys ``0 .. p`` (within
the sliding window if the model has one): the causal mask is aligned bottom-right, since a
chunk's queries start at ``start_pos`` while its keys start at 0.

On CPU in float32 and bfloat16 where oneDNN works in that dtype (``engine.model.kernel_choice``),
multi-token chunks are attended by ``engine.model.matmul_attention`` (oneDNN matmuls tile by tile:
float32 1.7x, bfloat16 2.5-3x faster than the CPU flash kernel for a cached prompt,
``bench/VLLM.md``); everywhere else by SDPA.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.flashinfer_attention import FlashInferAttention
from engine.model.kv_cache import PagedKVCache
from engine.model.matmul_attention import QueryTile, query_tiles, tiled_attention
from engine.model.runner_api import SeqChunk
from radix.blocks import blocks_for


@dataclass
class DecodeGroup:
    """The step's single-token queries (flat tokens ``0 .. size - 1``)."""

    block_tables: torch.Tensor
    """``[size, max_blocks]``, padded with block 0 past each context."""
    mask: torch.Tensor
    """``[size, 1, 1, max_blocks * block_size]``: which gathered keys each query sees."""

    @property
    def size(self) -> int:
        return self.block_tables.shape[0]


@dataclass
class PrefillChunk:
    """One multi-token chunk: flat tokens ``begin .. end - 1`` at positions ``start_pos ..``."""

    begin: int
    end: int
    block_table: torch.Tensor
    context_len: int
    mask: torch.Tensor | None
    """``[queries, context_len]``; None when plain causal attention over the chunk's own keys is exact
    (nothing cached before it, no window cut)."""
    tiles: list[QueryTile] | None = None
    """Set when the chunk is attended by matmuls (``engine.model.matmul_attention``) instead of SDPA."""


@dataclass
class AttentionMetadata:
    slots: torch.Tensor
    """``[tokens]`` cache slot of every flat token."""
    decode: DecodeGroup | None
    prefills: list[PrefillChunk]
    flashinfer: FlashInferAttention | None = None
    """Set on CUDA with FlashInfer: it attends the whole step, planned from the same chunks."""

    @classmethod
    def build(
        cls,
        decodes: list[SeqChunk],
        prefills: list[SeqChunk],
        block_size: int,
        window: int | None,
        device: torch.device,
        flashinfer: FlashInferAttention | None = None,
        matmul_prefill: torch.dtype | None = None,
    ) -> "AttentionMetadata":
        """Metadata for flat tokens laid out as ``decodes`` (one token each) then ``prefills``.

        With ``flashinfer``, plans it for the step instead of building the portable path's tables.
        With ``matmul_prefill``, the compute dtype where ``KernelChoice.matmul_prefill`` holds,
        multi-token chunks are attended by matmuls.
        """
        slots: list[int] = []
        for chunk in decodes + prefills:
            table = chunk.block_table
            slots.extend(
                table[pos // block_size] * block_size + pos % block_size
                for pos in range(chunk.start_pos, chunk.start_pos + len(chunk.token_ids))
            )
        slot_tensor = torch.tensor(slots, dtype=torch.long, device=device)
        if flashinfer is not None:
            flashinfer.plan(decodes + prefills)
            return cls(slot_tensor, None, [], flashinfer)
        return cls(
            slots=slot_tensor,
            decode=_decode_group(decodes, block_size, window, device) if decodes else None,
            prefills=_prefill_chunks(len(decodes), prefills, block_size, window, device, matmul_prefill),
        )


def _visible(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    visible = key_pos <= query_pos
    if window is not None:
        visible &= key_pos > query_pos - window
    return visible


def _decode_group(decodes: list[SeqChunk], block_size: int, window: int | None, device: torch.device) -> DecodeGroup:
    context_lens = [chunk.start_pos + 1 for chunk in decodes]
    max_blocks = blocks_for(max(context_lens), block_size)
    rows = []
    for chunk, context_len in zip(decodes, context_lens, strict=False):
        used = chunk.block_table[: blocks_for(context_len, block_size)]
        rows.append(used + [0] * (max_blocks - len(used)))
    tables = torch.tensor(rows, dtype=torch.long, device=device)
    query_pos = torch.tensor([chunk.start_pos for chunk in decodes], device=device)[:, None]
    key_pos = torch.arange(max_blocks * block_size, device=device)[None, :]
    mask = _visible(query_pos, key_pos, window)
    return DecodeGroup(tables, mask[:, None, None, :])


def _prefill_chunks(
    first_token: int,
    prefills: list[SeqChunk],
    block_size: int,
    window: int | None,
    device: torch.device,
    matmul: torch.dtype | None,
) -> list[PrefillChunk]:
    result = []
    begin = first_token
    for chunk in prefills:
        count = len(chunk.token_ids)
        context_len = chunk.start_pos + count
        mask = tiles = None
        if matmul is not None:
            tiles = query_tiles(chunk.start_pos, count, window, device, matmul)
        elif chunk.start_pos > 0 or (window is not None and context_len > window):
            query_pos = torch.arange(chunk.start_pos, context_len, device=device)[:, None]
            mask = _visible(query_pos, torch.arange(context_len, device=device)[None, :], window)
        table = torch.tensor(chunk.block_table[: blocks_for(context_len, block_size)], device=device)
        result.append(PrefillChunk(begin, begin + count, table, context_len, mask, tiles))
        begin += count
    return result


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: PagedKVCache,
    layer: int,
    metadata: AttentionMetadata,
) -> torch.Tensor:
    """Store the step's ``key``/``value`` in the cache, then attend.

    ``query`` is ``[tokens, heads, head_dim]``, ``key``/``value`` ``[tokens, kv_heads, head_dim]``;
    returns ``[tokens, heads, head_dim]``. Inputs to SDPA are 4-D: with 3-D ones PyTorch falls back
    from its CPU flash kernel to the slow math path. A decode's query heads that share a KV head
    are passed as that head's query rows (``[batch, kv_heads, group, dim]``): each gathered KV head
    is then read once instead of once per query head, 1.2x (float32) to 4x (bfloat16) faster on CPU.
    CUDA's SDPA kernels may return that output with heads innermost, so it is reshaped, not viewed.
    """
    cache.write(layer, metadata.slots, key, value)
    if metadata.flashinfer is not None:
        return metadata.flashinfer.run(query.contiguous(), cache.pool[layer])
    out = torch.empty_like(query)
    decode = metadata.decode
    if decode is not None:
        keys, values = cache.read(layer, decode.block_tables)
        size, kv_heads = decode.size, keys.shape[2]
        grouped = query[:size].view(size, kv_heads, -1, query.shape[-1])
        out[:size] = F.scaled_dot_product_attention(
            grouped, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=decode.mask
        ).reshape(size, -1, query.shape[-1])
    for chunk in metadata.prefills:
        span = slice(chunk.begin, chunk.end)
        if chunk.mask is None and chunk.context_len == chunk.end - chunk.begin:
            keys, values = key[span], value[span]
        else:
            keys, values = cache.read(layer, chunk.block_table)
            keys, values = keys[: chunk.context_len], values[: chunk.context_len]
        if chunk.tiles is not None:
            out[span] = tiled_attention(query[span], keys, values, chunk.tiles)
            continue
        out[span] = F.scaled_dot_product_attention(
            query[None, span].transpose(1, 2),
            keys[None].transpose(1, 2),
            values[None].transpose(1, 2),
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None,
            enable_gqa=True,
        )[0].transpose(0, 1)
    return out
