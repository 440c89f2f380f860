"""The real pool's blocks as bytes (``engine.core.kv_transfer_blocks.BlockIO`` over ``PagedKVCache``).

A block's bytes are its K and V for every layer, ``[layers, 2, block_size, kv_heads, head_dim]``
in the storage dtype, then (fp8) its ``[layers, 2]`` float32 scales; bytes are moved as bytes,
so a transferred block is bit-identical to the one the prefill engine computed.
"""

import torch

from engine.model.kv_cache import Fp8PagedKVCache, PagedKVCache


class TorchBlockIO:
    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        pool = cache.pool
        layers, _, _, block_size, heads, dim = pool.shape
        self._scales = cache.scales if isinstance(cache, Fp8PagedKVCache) else None
        data_bytes = layers * 2 * block_size * heads * dim * pool.element_size()
        scale_bytes = layers * 2 * 4 if self._scales is not None else 0
        self.bytes_per_block = data_bytes + scale_bytes
        scaled = "+scales" if self._scales is not None else ""
        self.layout = f"{pool.dtype}{scaled}:{layers}x2x{block_size}x{heads}x{dim}"

    @torch.inference_mode()
    def read(self, block_ids: list[int]) -> bytes:
        pool = self.cache.pool
        index = torch.tensor(block_ids, device=pool.device)
        data = pool.view(torch.uint8).index_select(2, index).permute(2, 0, 1, 3, 4, 5).reshape(len(block_ids), -1)
        if self._scales is not None:
            scales = self._scales.index_select(2, index).permute(2, 0, 1).contiguous()
            data = torch.cat((data, scales.view(torch.uint8).reshape(len(block_ids), -1)), dim=1)
        return data.cpu().numpy().tobytes()

    @torch.inference_mode()
    def write(self, block_ids: list[int], payload: bytes, rows: list[int]) -> None:
        pool = self.cache.pool
        table = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(-1, self.bytes_per_block)
        picked = table.index_select(0, torch.tensor(rows)).to(pool.device)
        layers, _, _, block_size, heads, dim = pool.shape
        data_bytes = layers * 2 * block_size * heads * dim * pool.element_size()
        index = torch.tensor(block_ids, device=pool.device)
        data = picked[:, :data_bytes].reshape(len(block_ids), layers, 2, block_size, heads, -1)
        pool.view(torch.uint8).index_copy_(2, index, data.permute(1, 2, 0, 3, 4, 5))
        if self._scales is not None:
            scales = picked[:, data_bytes:].contiguous().view(torch.float32).reshape(len(block_ids), layers, 2)
            self._scales.index_copy_(2, index, scales.permute(1, 2, 0))

    def wire_seconds(self, num_blocks: int) -> float:
        return 0.0


def torch_block_io(runner: object) -> TorchBlockIO:
    """The block I/O of a real runner's pool."""
    from engine.model.model_runner import TorchModelRunner

    assert isinstance(runner, TorchModelRunner), "the KV connector's byte transfer needs the real model runner"
    return TorchBlockIO(runner.kv_cache)
