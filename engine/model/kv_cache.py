"""The KV pool: every layer's K and V, as fixed-size blocks addressed by slot.

Slot ``s`` is offset ``s % block_size`` of block ``s // block_size``. The pool holds
``[num_layers, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]``; reads gather whole
blocks by block table and return them in the compute dtype.
"""

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max


@dataclass(frozen=True)
class KVCacheShape:
    """What sizes a KV pool: the model's layers, KV heads and head size, and the pool's blocks."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int


@dataclass
class HostKVBuffer:
    """The host tier's memory: ``[num_layers, 2, slots, block_size, kv_heads, head_dim]`` in the
    pool's storage dtype (pinned when the pool is on CUDA), plus fp8's per-block scales."""

    pool: torch.Tensor
    scales: torch.Tensor | None = None


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A byte view: index_copy on CPU does not take every dtype (fp8), bytes copy the same."""
    return tensor.view(torch.uint8)


class PagedKVCache:
    """KV stored in a float dtype (the model's own, or a narrower one to fit more tokens)."""

    def __init__(
        self, shape: KVCacheShape, storage_dtype: torch.dtype, compute_dtype: torch.dtype, device: torch.device
    ) -> None:
        self.block_size = shape.block_size
        self.compute_dtype = compute_dtype
        self.pool = torch.zeros(
            shape.num_layers,
            2,
            shape.num_blocks,
            shape.block_size,
            shape.num_kv_heads,
            shape.head_dim,
            dtype=storage_dtype,
            device=device,
        )
        self._scratch = torch.empty(0, dtype=compute_dtype, device=device)

    def write(self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store ``key``/``value`` ``[tokens, kv_heads, head_dim]`` at ``slots`` ``[tokens]``."""
        flat = self.pool[layer].flatten(1, 2)
        flat[0].index_copy_(0, slots, key.to(flat.dtype))
        flat[1].index_copy_(0, slots, value.to(flat.dtype))

    def read(self, layer: int, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the blocks in ``block_tables`` ``[..., blocks]``: ``[..., blocks * block_size, heads, dim]``.

        The result lives in a scratch buffer reused by the next ``read``: gathering into fresh
        memory for every layer costs more in page faults than the copy itself.
        """
        blocks = self._gather(layer, block_tables)
        tokens = blocks.view(2, *block_tables.shape[:-1], -1, *blocks.shape[-2:])
        return tokens[0], tokens[1]

    def allocate_host(self, num_slots: int) -> HostKVBuffer:
        """Host memory for ``num_slots`` blocks of every layer's K and V."""
        shape = (*self.pool.shape[:2], num_slots, *self.pool.shape[3:])
        pinned = self.pool.device.type == "cuda"
        return HostKVBuffer(torch.zeros(shape, dtype=self.pool.dtype, device="cpu", pin_memory=pinned))

    def copy_to_host(self, host: HostKVBuffer, blocks: list[int], slots: list[int]) -> None:
        """Copy device ``blocks`` (all layers, K and V) into host ``slots``; both lists without repeats."""
        data = _as_bytes(self.pool).index_select(2, torch.tensor(blocks, device=self.pool.device))
        _as_bytes(host.pool).index_copy_(2, torch.tensor(slots), data.cpu())

    def copy_from_host(self, host: HostKVBuffer, slots: list[int], blocks: list[int]) -> None:
        """Copy host ``slots`` into device ``blocks`` (all layers, K and V); both lists without repeats."""
        data = _as_bytes(host.pool).index_select(2, torch.tensor(slots))
        device_blocks = torch.tensor(blocks, device=self.pool.device)
        _as_bytes(self.pool).index_copy_(2, device_blocks, data.to(self.pool.device))

    def _gather(self, layer: int, block_tables: torch.Tensor) -> torch.Tensor:
        """``[2, blocks, block_size, heads, dim]`` in the compute dtype, in the scratch buffer."""
        pool = self.pool[layer]
        indices = block_tables.flatten()
        shape = (2, indices.numel(), *pool.shape[2:])
        needed = torch.Size(shape).numel()
        if self._scratch.numel() < needed:
            self._scratch = torch.empty(needed, dtype=self._scratch.dtype, device=self._scratch.device)
        out = self._scratch[:needed].view(shape)
        if pool.dtype == out.dtype:
            torch.index_select(pool, 1, indices, out=out)
        else:
            out.copy_(pool.index_select(1, indices))
        return out


class Fp8PagedKVCache(PagedKVCache):
    """KV stored as float8 e4m3 with one float32 scale per (layer, K/V, block).

    A write re-quantizes each block it touches as a whole: the block is dequantized, the new
    tokens are put in, offsets past the last written one (stale data of an earlier owner) are
    zeroed, and the scale becomes the block's absolute maximum over the e4m3 maximum.
    """

    def __init__(self, shape: KVCacheShape, compute_dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(shape, FP8_DTYPE, compute_dtype, device)
        self.scales = torch.ones(shape.num_layers, 2, shape.num_blocks, dtype=torch.float32, device=device)

    def write(self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        pool, scales = self.pool[layer], self.scales[layer]
        touched, which_block = torch.unique(slots // self.block_size, return_inverse=True)
        offsets = slots % self.block_size
        last_offset = torch.zeros_like(touched).scatter_reduce_(0, which_block, offsets, "amax")
        blocks = pool[:, touched].float() * scales[:, touched, None, None, None]
        blocks[:, which_block, offsets] = torch.stack((key, value)).float()
        written = torch.arange(self.block_size, device=slots.device) <= last_offset[:, None]
        blocks *= written[None, :, :, None, None]
        new_scales = (blocks.abs().amax(dim=(2, 3, 4)) / FP8_MAX).clamp_(min=torch.finfo(torch.float32).tiny)
        pool[:, touched] = (blocks / new_scales[:, :, None, None, None]).to(FP8_DTYPE)
        scales[:, touched] = new_scales

    def allocate_host(self, num_slots: int) -> HostKVBuffer:
        host = super().allocate_host(num_slots)
        pinned = self.scales.device.type == "cuda"
        shape = (*self.scales.shape[:2], num_slots)
        host.scales = torch.ones(shape, dtype=torch.float32, device="cpu", pin_memory=pinned)
        return host

    def copy_to_host(self, host: HostKVBuffer, blocks: list[int], slots: list[int]) -> None:
        super().copy_to_host(host, blocks, slots)
        assert host.scales is not None
        scales = self.scales.index_select(2, torch.tensor(blocks, device=self.scales.device))
        host.scales.index_copy_(2, torch.tensor(slots), scales.cpu())

    def copy_from_host(self, host: HostKVBuffer, slots: list[int], blocks: list[int]) -> None:
        super().copy_from_host(host, slots, blocks)
        assert host.scales is not None
        scales = host.scales.index_select(2, torch.tensor(slots)).to(self.scales.device)
        self.scales.index_copy_(2, torch.tensor(blocks, device=self.scales.device), scales)

    def _gather(self, layer: int, block_tables: torch.Tensor) -> torch.Tensor:
        blocks = super()._gather(layer, block_tables)
        scales = self.scales[layer].index_select(1, block_tables.flatten())
        return blocks.mul_(scales[:, :, None, None, None].to(blocks.dtype))
