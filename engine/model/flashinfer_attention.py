"""Paged attention on CUDA with FlashInfer's kernels, where FlashInfer is installed.

One ``BatchPrefillWithPagedKVCacheWrapper`` serves the whole step: a decode is a chunk of one
query token, and FlashInfer's causal mask is aligned bottom-right (a chunk's queries are the last
positions of its context), which is the engine's own rule. The wrapper is planned once per step
from the block tables and run once per layer on that layer's K and V pools, read in place by
block table (NHD layout: ``[blocks, block_size, kv_heads, head_dim]``, the engine's own).

Not used in float32 (FlashInfer's kernels take float16/bfloat16), for fp8 KV (the engine scales
each block; FlashInfer takes one scale per tensor), for KV stored in another dtype than the
model's, nor on CPU; ``select_backend`` says which backend a runner gets and why.
"""

import importlib.util
import logging
from typing import Any

import torch

from engine.model.runner_api import SeqChunk
from radix.blocks import blocks_for

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 128 * 1024 * 1024


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)


def select_backend(
    device: torch.device, compute_dtype: torch.dtype, kv_cache_dtype: str, kv_in_compute_dtype: bool
) -> str:
    """``flashinfer`` or ``portable`` (SDPA over gathered blocks), with a log line on CUDA saying why."""
    if device.type != "cuda":
        return "portable"
    if compute_dtype not in FLASHINFER_DTYPES:
        log.info("attention: portable SDPA path (FlashInfer computes in float16/bfloat16, not %s)", compute_dtype)
        return "portable"
    if kv_cache_dtype == "fp8":
        log.info("attention: portable SDPA path (fp8 KV has per-block scales, which FlashInfer does not take)")
        return "portable"
    if not kv_in_compute_dtype:
        log.info("attention: portable SDPA path (KV stored in another dtype than the model computes in)")
        return "portable"
    if not flashinfer_available():
        log.warning("attention: FlashInfer is not installed; using the portable SDPA path over gathered blocks")
        return "portable"
    log.info("attention: FlashInfer paged kernels")
    return "flashinfer"


class FlashInferAttention:
    """The FlashInfer wrapper of one runner, re-planned for every step."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        window: int | None,
        device: torch.device,
    ) -> None:
        import flashinfer

        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.dtype = dtype
        self.window_left = -1 if window is None else window - 1
        self.device = device
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper: Any = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")

    def plan(self, chunks: list[SeqChunk]) -> None:
        """Plan a step whose flat tokens are ``chunks``' tokens, in this order."""
        qo_indptr, kv_indptr, kv_indices, last_page_lens = [0], [0], [], []
        for chunk in chunks:
            context_len = chunk.start_pos + len(chunk.token_ids)
            used = blocks_for(context_len, self.block_size)
            qo_indptr.append(qo_indptr[-1] + len(chunk.token_ids))
            kv_indices.extend(chunk.block_table[:used])
            kv_indptr.append(len(kv_indices))
            last_page_lens.append(context_len - (used - 1) * self.block_size)
        self.wrapper.plan(
            self._int32(qo_indptr),
            self._int32(kv_indptr),
            self._int32(kv_indices),
            self._int32(last_page_lens),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
            causal=True,
            window_left=self.window_left,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )

    def _int32(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.device)

    def run(self, query: torch.Tensor, layer_pool: torch.Tensor) -> torch.Tensor:
        """``query`` ``[tokens, heads, dim]`` over ``layer_pool`` ``[2, blocks, block_size, kv_heads, dim]``."""
        return self.wrapper.run(query, (layer_pool[0], layer_pool[1]))
