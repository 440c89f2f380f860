"""The real model behind the scheduler: one ``execute`` call computes one step over the paged cache."""

import logging
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.model.attention import AttentionMetadata
from engine.model.cpu_features import CpuFeatures, probe_cpu
from engine.model.flashinfer_attention import FlashInferAttention, select_backend
from engine.model.grammar import Bitmask, GrammarMatcher, MaskFiller, allocate_bitmask
from engine.model.kernel_choice import choose_kernels
from engine.model.kv_cache import Fp8PagedKVCache, HostKVBuffer, KVCacheShape, PagedKVCache
from engine.model.llama import LlamaForPagedLM
from engine.model.loader import load_model
from engine.model.logprobs_prompt import prompt_logprobs
from engine.model.lora_batch import LoRABatch, segments_of
from engine.model.lora_modules import AdapterConfig
from engine.model.lora_weights import AdapterWeights, load_adapter, projection_shapes
from engine.model.pooling import last_token_embedding
from engine.model.runner_api import BlockTransfer, SeqChunk, TokenLogprobs
from engine.model.sampler import Sampler, apply_penalties, apply_token_bitmask, token_logprobs

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8")

log = logging.getLogger(__name__)


class TorchModelRunner:
    """Implements ``engine.model.runner_api.ModelRunner`` with the Llama-family forward in ``engine.model.llama``.

    Single-token chunks (decodes) are attended in one batched call; longer chunks (prefill) one
    by one; all linear layers run once over the step's packed tokens. On CUDA with FlashInfer
    installed, FlashInfer's paged kernels attend the whole step instead
    (``engine.model.flashinfer_attention``). ``eos_token_id`` is the
    config's (the first, where it lists several). Beyond the pool, attention needs a scratch buffer
    as large as the K/V a step gathers (batch x longest context, in the compute dtype).

    On CPU the kernels follow ``cpu`` (default: probed here, less the environment's switches;
    ``engine.model.kernel_choice``), logged in one line at load.
    """

    def __init__(
        self,
        model: str,
        block_size: int,
        num_blocks: int,
        device: str = "cpu",
        dtype: str = "float32",
        kv_cache_dtype: str = "auto",
        host_blocks: int = 0,
        adapters: tuple[AdapterConfig, ...] = (),
        cpu: CpuFeatures | None = None,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, not {kv_cache_dtype!r}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        compute_dtype = DTYPES[dtype]
        if self.device.type == "cpu" and cpu is None:
            cpu = probe_cpu()
        if kv_cache_dtype == "fp8" and cpu is not None and not cpu.fp8_conversion:
            raise RuntimeError("this PyTorch cannot convert float8_e4m3fn on this CPU; use --kv-cache-dtype auto")
        kernels = choose_kernels(self.device, compute_dtype, cpu)
        log.info("%s", kernels.summary)
        loaded = load_model(model, device)
        self.hf_config: dict = loaded.config.to_dict()
        eos = loaded.config.eos_token_id
        self.eos_token_id: int | None = eos[0] if isinstance(eos, list) else eos
        self.model = LlamaForPagedLM(loaded.config, loaded.weights, compute_dtype, self.device, kernels)
        shapes = projection_shapes(loaded.config, self.model.head_dim)
        self.adapters: list[AdapterWeights] = [
            load_adapter(config, shapes, self.model.num_layers, compute_dtype, self.device) for config in adapters
        ]
        """Loaded LoRA adapters; a chunk's ``lora_id`` i runs under ``adapters[i - 1]``."""
        shape = KVCacheShape(
            self.model.num_layers, num_blocks, block_size, self.model.num_kv_heads, self.model.head_dim
        )
        if kv_cache_dtype == "fp8":
            self.kv_cache: PagedKVCache = Fp8PagedKVCache(shape, compute_dtype, self.device)
        else:
            storage = compute_dtype if kv_cache_dtype == "auto" else DTYPES[kv_cache_dtype]
            self.kv_cache = PagedKVCache(shape, storage, compute_dtype, self.device)
        self.host_kv: HostKVBuffer | None = self.kv_cache.allocate_host(host_blocks) if host_blocks else None
        self.attention_backend = select_backend(
            self.device, compute_dtype, kv_cache_dtype, self.kv_cache.pool.dtype == compute_dtype
        )
        self.flashinfer: FlashInferAttention | None = None
        if self.attention_backend == "flashinfer":
            self.flashinfer = FlashInferAttention(
                loaded.config.num_attention_heads,
                self.model.num_kv_heads,
                self.model.head_dim,
                block_size,
                compute_dtype,
                self.model.sliding_window,
                self.device,
            )
        self.matmul_prefill = compute_dtype if kernels.matmul_prefill else None
        self.sampler = Sampler(self.device)
        self._logprobs: dict[int, TokenLogprobs] = {}
        self._mask_filler = MaskFiller()
        self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        """Grammar masks are computed here while the forward runs (both release the GIL)."""

    constrained_decoding = True

    @torch.inference_mode()
    def transfer(self, transfers: list[BlockTransfer]) -> None:
        """Host-tier copies in order, batched into runs of one direction that reuse no block or slot."""
        host = self.host_kv
        if host is None:
            assert not transfers, "host-tier copies without a host tier"
            return
        for run in _copy_runs(transfers):
            blocks = [transfer.device_block for transfer in run]
            slots = [transfer.host_slot for transfer in run]
            if run[0].to_host:
                self.kv_cache.copy_to_host(host, blocks, slots)
            else:
                self.kv_cache.copy_from_host(host, slots, blocks)

    @torch.inference_mode()
    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        if not chunks:
            return []
        order = sorted(range(len(chunks)), key=lambda index: (len(chunks[index].token_ids) > 1, chunks[index].lora_id))
        ordered = [chunks[index] for index in order]
        decodes = [chunk for chunk in ordered if len(chunk.token_ids) == 1]
        metadata = AttentionMetadata.build(
            decodes,
            ordered[len(decodes) :],
            self.block_size,
            self.model.sliding_window,
            self.device,
            self.flashinfer,
            self.matmul_prefill,
        )
        sampled_order = [index for index in order if chunks[index].sample]
        masks = self._start_masks([chunks[index] for index in sampled_order])
        token_ids = [token for chunk in ordered for token in chunk.token_ids]
        positions = [pos for chunk in ordered for pos in range(chunk.start_pos, chunk.start_pos + len(chunk.token_ids))]
        hidden = self.model.hidden_states(
            torch.tensor(token_ids, device=self.device),
            torch.tensor(positions, device=self.device),
            self.kv_cache,
            metadata,
            self._lora_batch(ordered),
        )
        results: list[int | None] = [None] * len(chunks)
        sampled_indices, last_rows = [], []
        end = 0
        for index, chunk in zip(order, ordered, strict=False):
            end += len(chunk.token_ids)
            if chunk.sample:
                sampled_indices.append(index)
                last_rows.append(end - 1)
        if sampled_indices:
            logits = self.model.logits(hidden[torch.tensor(last_rows, device=self.device)])
            sampled = [chunks[index] for index in sampled_indices]
            adjusted = apply_penalties(logits, sampled)
            if masks is not None:
                rows, bitmask = masks.result()
                adjusted = apply_token_bitmask(adjusted, rows, bitmask)
            tokens = self.sampler(adjusted, [c.sampling for c in sampled], [c.num_generated for c in sampled])
            for index, token in zip(sampled_indices, tokens, strict=False):
                results[index] = token
            self._logprobs = self._logprobs_of(logits, sampled, tokens)
        return results

    def _start_masks(self, sampled: list[SeqChunk]) -> "Future[tuple[list[int], Bitmask]] | None":
        """Start computing the token masks of the constrained rows of ``sampled`` (None: there are none)."""
        rows = [row for row, chunk in enumerate(sampled) if chunk.constraint is not None]
        if not rows:
            return None
        matchers = [sampled[row].constraint for row in rows]
        grammar_matchers = [matcher for matcher in matchers if isinstance(matcher, GrammarMatcher)]
        assert len(grammar_matchers) == len(matchers), "constraints come from engine.model.grammar"

        def fill() -> tuple[list[int], Bitmask]:
            bitmask = allocate_bitmask(len(rows), grammar_matchers[0].vocab_size)
            self._mask_filler.fill(grammar_matchers, list(range(len(rows))), bitmask)
            return rows, bitmask

        return self._mask_thread.submit(fill)

    def _lora_batch(self, ordered: list[SeqChunk]) -> LoRABatch | None:
        """The step's adapter segments (chunks are ordered so each adapter's rows are contiguous)."""
        if not any(chunk.lora_id for chunk in ordered):
            return None
        lengths = [len(chunk.token_ids) for chunk in ordered]
        return LoRABatch(segments_of([chunk.lora_id for chunk in ordered], lengths, self.adapters))

    def _logprobs_of(self, logits: torch.Tensor, chunks: list[SeqChunk], tokens: list[int]) -> dict[int, TokenLogprobs]:
        rows = [row for row, chunk in enumerate(chunks) if chunk.sampling.logprobs is not None]
        if not rows:
            return {}
        tops = [chunks[row].sampling.logprobs or 0 for row in rows]
        found = token_logprobs(logits[torch.tensor(rows, device=self.device)], [tokens[row] for row in rows], tops)
        return {chunks[row].seq_id: logprobs for row, logprobs in zip(rows, found, strict=True)}

    def take_logprobs(self) -> dict[int, TokenLogprobs]:
        logprobs, self._logprobs = self._logprobs, {}
        return logprobs

    @torch.inference_mode()
    def embed(self, token_ids: list[int], lora_id: int = 0) -> list[float]:
        lora = LoRABatch(segments_of([lora_id], [len(token_ids)], self.adapters)) if lora_id else None
        return last_token_embedding(self.model, token_ids, self.block_size, self.device, lora)

    @torch.inference_mode()
    def prompt_logprobs(self, token_ids: list[int], top: int, lora_id: int = 0) -> list[TokenLogprobs | None]:
        lora = LoRABatch(segments_of([lora_id], [len(token_ids)], self.adapters)) if lora_id else None
        return prompt_logprobs(self.model, token_ids, top, self.block_size, self.device, lora)

    def release(self, seq_id: int) -> None:
        """Nothing to forget: seeded draws derive from (seed, num_generated), not from kept state."""


def _copy_runs(transfers: list[BlockTransfer]) -> list[list[BlockTransfer]]:
    """Consecutive transfers of one direction, cut wherever a block or slot would repeat (order matters then)."""
    runs: list[list[BlockTransfer]] = []
    blocks: set[int] = set()
    slots: set[int] = set()
    for transfer in transfers:
        fresh = transfer.device_block not in blocks and transfer.host_slot not in slots
        if runs and runs[-1][0].to_host == transfer.to_host and fresh:
            runs[-1].append(transfer)
        else:
            runs.append([transfer])
            blocks, slots = set(), set()
        blocks.add(transfer.device_block)
        slots.add(transfer.host_slot)
    return runs
