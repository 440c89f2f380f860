"""Embeddings from the causal LM's hidden states, pooled as vLLM pools a decoder-only model.

vLLM's default pooler for the ``embed`` task on a generative model is ``LAST`` with
normalization: the final-norm hidden state of the last prompt token, scaled to unit L2 norm.
The forward runs over a scratch paged cache of its own, so an embedding request never takes
blocks from (or adds blocks to) the engine's prefix cache.
"""

import torch

from engine.model.attention import AttentionMetadata
from engine.model.kv_cache import KVCacheShape, PagedKVCache
from engine.model.llama import LlamaForPagedLM
from engine.model.lora_batch import LoRABatch
from engine.model.runner_api import SamplingParams, SeqChunk
from radix.blocks import blocks_for


def scratch_hidden_states(
    model: LlamaForPagedLM,
    token_ids: list[int],
    block_size: int,
    device: torch.device,
    lora: LoRABatch | None = None,
) -> torch.Tensor:
    """The final-norm hidden state of every prompt position, from one forward over a scratch
    paged cache that never touches the engine's prefix cache."""
    num_blocks = blocks_for(len(token_ids), block_size)
    compute_dtype = model.embed.dtype
    shape = KVCacheShape(model.num_layers, num_blocks, block_size, model.num_kv_heads, model.head_dim)
    cache = PagedKVCache(shape, compute_dtype, compute_dtype, device)
    chunk = SeqChunk(-1, token_ids, 0, list(range(num_blocks)), sample=False, sampling=SamplingParams())
    matmul = compute_dtype if model.kernels.matmul_prefill else None
    metadata = AttentionMetadata.build([], [chunk], block_size, model.sliding_window, device, None, matmul)
    positions = torch.arange(len(token_ids), device=device)
    return model.hidden_states(torch.tensor(token_ids, device=device), positions, cache, metadata, lora)


def last_token_embedding(
    model: LlamaForPagedLM,
    token_ids: list[int],
    block_size: int,
    device: torch.device,
    lora: LoRABatch | None = None,
) -> list[float]:
    last = scratch_hidden_states(model, token_ids, block_size, device, lora)[-1].float()
    return (last / last.norm().clamp(min=1e-12)).tolist()
