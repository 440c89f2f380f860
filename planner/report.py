"""The planner's findings for one model as one JSON-ready dict (``kvgate plan --json``)."""

from dataclasses import asdict
from typing import Any

from planner.arch import ModelArch
from planner.capacity import CapacityPlan, TensorParallelAnswer
from planner.kv_math import kv_bytes_per_sequence, kv_bytes_per_token
from planner.parallel import SINGLE_GPU, Parallelism, gpu_shard

STANDARD_LENGTHS = (1024, 4096, 8192, 32768, 131072)
DTYPE_GROUPS = {"fp32": "fp32", "bf16/fp16": "bf16", "fp8/int8": "fp8", "int4": "int4"}


def sequence_lengths(arch: ModelArch) -> list[int]:
    """The standard lengths the model can hold, plus its own maximum when that is shorter than 128k."""
    lengths = [tokens for tokens in STANDARD_LENGTHS if tokens <= arch.max_context]
    if arch.max_context < STANDARD_LENGTHS[-1] and arch.max_context not in lengths:
        lengths.append(arch.max_context)
    return lengths


def build_report(
    arch: ModelArch,
    kv_dtype: str,
    capacity: CapacityPlan | str | None,
    smallest_tensor_parallel: TensorParallelAnswer | None = None,
    parallel: Parallelism = SINGLE_GPU,
) -> dict[str, Any]:
    """Everything ``kvgate plan`` prints. ``capacity`` is the plan, the reason there is none
    (the config lacks what the weights estimate needs), or None when no GPU was given."""
    windows = [window for window in arch.layer_windows if window is not None]
    per_token = kv_bytes_per_token(arch, kv_dtype)
    report: dict[str, Any] = {
        "model": arch.name,
        "architecture": {
            "attention": arch.attention_kind,
            "layers": arch.num_layers,
            "attention_heads": arch.num_attention_heads,
            "kv_heads": arch.num_kv_heads,
            "head_dim": arch.head_dim,
            "kv_lora_rank": arch.kv_lora_rank,
            "qk_rope_head_dim": arch.qk_rope_head_dim,
            "sliding_window_layers": len(windows),
            "sliding_window": max(windows) if windows else None,
            "max_context": arch.max_context,
            "parameters": arch.param_count,
            "parameters_missing": arch.params_missing,
        },
        "formula": formula(arch),
        "bytes_per_token": {group: kv_bytes_per_token(arch, dtype) for group, dtype in DTYPE_GROUPS.items()},
        "kv_dtype": kv_dtype,
        "per_sequence": [_sequence_row(arch, tokens, kv_dtype, per_token) for tokens in sequence_lengths(arch)],
    }
    if parallel.gpus > 1:
        report["per_gpu_kv"] = per_gpu_kv(arch, kv_dtype, parallel)
    if isinstance(capacity, str):
        report["capacity"] = None
        report["capacity_unavailable"] = capacity
    elif capacity is not None:
        report["capacity"] = capacity_report(capacity)
    if smallest_tensor_parallel is not None:
        report["smallest_tensor_parallel"] = {
            "concurrency": smallest_tensor_parallel.concurrency,
            "tensor_parallel": smallest_tensor_parallel.tensor,
            "tried": [
                {"tensor_parallel": size, "max_sequences": count}
                for size, count in smallest_tensor_parallel.tried.items()
            ],
        }
    return report


def per_gpu_kv(arch: ModelArch, kv_dtype: str, parallel: Parallelism) -> dict[str, Any]:
    """What one GPU of the largest pipeline stage caches per token."""
    shards = [gpu_shard(arch, parallel, stage) for stage in range(parallel.pipeline)]
    largest = max(shards, key=lambda shard: shard.num_layers)
    return {
        "tensor_parallel": parallel.tensor,
        "pipeline_parallel": parallel.pipeline,
        "layers": largest.num_layers,
        "kv_heads": None if arch.is_mla else largest.num_kv_heads,
        "kv_heads_replicated": not arch.is_mla and arch.num_kv_heads < parallel.tensor,
        "mla_latent_replicated": arch.is_mla and parallel.tensor > 1,
        "bytes_per_token": kv_bytes_per_token(largest, kv_dtype),
    }


def capacity_report(plan: CapacityPlan) -> dict[str, Any]:
    """The plan per GPU (the tightest one of the replica), per replica, and per pipeline stage."""
    gpus = plan.parallel.gpus
    tightest = plan.tightest
    return {
        "gpu_memory_bytes": plan.gpu_memory_bytes,
        "utilization": plan.utilization,
        "weights_dtype": plan.weights_dtype,
        "weights_source": "estimate" if plan.weights_given_bytes is None else "--weights-gib",
        "kv_dtype": plan.kv_dtype,
        "prompt_tokens": plan.prompt_tokens,
        "output_tokens": plan.output_tokens,
        "tensor_parallel": plan.parallel.tensor,
        "pipeline_parallel": plan.parallel.pipeline,
        "gpus": gpus,
        "per_gpu": {
            "stage": tightest.stage,
            "gpu_memory_bytes": plan.gpu_memory_bytes,
            "usable_bytes": plan.usable_bytes,
            "weights_bytes": tightest.weights_bytes,
            "overhead_bytes": plan.overhead_bytes,
            "kv_budget_bytes": tightest.kv_budget_bytes,
            "kv_bytes_per_token": tightest.kv_bytes_per_token,
            "kv_tokens": tightest.kv_tokens,
            "sequence_bytes": tightest.sequence_bytes,
            "max_sequences": tightest.max_sequences,
        },
        "per_replica": {
            "gpu_memory_bytes": gpus * plan.gpu_memory_bytes,
            "usable_bytes": gpus * plan.usable_bytes,
            "weights_bytes": plan.replica_weights_bytes,
            "overhead_bytes": gpus * plan.overhead_bytes,
            "kv_budget_bytes": plan.replica_kv_budget_bytes,
            "kv_tokens": plan.kv_tokens,
            "sequence_bytes": plan.replica_sequence_bytes,
            "max_sequences": plan.max_sequences,
        },
        "stages": [asdict(gpu) for gpu in plan.stages],
    }


def formula(arch: ModelArch) -> str:
    """bytes/token written out with this model's numbers."""
    elements = arch.num_layers * arch.kv_elements_per_token_per_layer
    if arch.is_mla:
        return (
            f"bytes/token = {arch.num_layers} layers x ({arch.kv_lora_rank} kv_lora_rank + "
            f"{arch.qk_rope_head_dim} qk_rope_head_dim) x bytes/element = {elements:,} x bytes/element "
            "(MLA caches one latent per layer, not K and V)"
        )
    return (
        f"bytes/token = 2 (K and V) x {arch.num_layers} layers x {arch.num_kv_heads} kv_heads x "
        f"{arch.head_dim} head_dim x bytes/element = {elements:,} x bytes/element"
    )


def _sequence_row(arch: ModelArch, tokens: int, kv_dtype: str, bytes_per_token: int) -> dict[str, Any]:
    held = kv_bytes_per_sequence(arch, tokens, kv_dtype)
    return {"tokens": tokens, "bytes": held, "window_capped": held < tokens * bytes_per_token}
