"""``kvgate plan``'s report (see planner.report) as the small text tables it prints."""

from typing import Any

from planner.sizes import format_bytes


def render_text(report: dict[str, Any]) -> str:
    """Architecture facts, the formula, bytes per token, KV per sequence, and capacity if planned."""
    sections = [
        _facts(report),
        report["formula"],
        _table(
            ("KV dtype", "bytes/token"),
            [(group, format_bytes(size)) for group, size in report["bytes_per_token"].items()],
        ),
        _table(
            ("tokens", f"KV/sequence ({report['kv_dtype']})"),
            [(f"{row['tokens']:,}", _held(row)) for row in report["per_sequence"]],
        ),
    ]
    if "per_gpu_kv" in report:
        sections.append(_per_gpu_kv(report["per_gpu_kv"], report["architecture"], report["kv_dtype"]))
    if report.get("capacity") is not None:
        sections.append(_capacity(report["capacity"]))
    elif "capacity_unavailable" in report:
        sections.append(f"capacity: not computed: {report['capacity_unavailable']}")
    if "smallest_tensor_parallel" in report:
        sections.append(_smallest_tensor_parallel(report["smallest_tensor_parallel"], report["capacity"]))
    return "\n\n".join(sections)


def _facts(report: dict[str, Any]) -> str:
    arch = report["architecture"]
    facts = [("model", report["model"]), ("attention", _attention(arch)), ("layers", f"{arch['layers']}")]
    if arch["kv_lora_rank"] is None:
        facts.append(("head dim", f"{arch['head_dim']}"))
    else:
        latent = f"{arch['kv_lora_rank']} kv_lora_rank + {arch['qk_rope_head_dim']} qk_rope_head_dim"
        facts.append(("KV latent", latent))
    if arch["sliding_window_layers"]:
        window = f"{arch['sliding_window']:,} tokens on {arch['sliding_window_layers']} layers"
        facts.append(("sliding window", window))
    facts.append(("max context", f"{arch['max_context']:,} tokens"))
    if arch["parameters"] is None:
        facts.append(("parameters", f"unknown: {arch['parameters_missing']}"))
    else:
        facts.append(("parameters", f"{arch['parameters'] / 1e9:.3f} B"))
    return "\n".join(f"{name:<15}{value}" for name, value in facts)


def _attention(arch: dict[str, Any]) -> str:
    if arch["attention"] == "MLA":
        return f"MLA: {arch['attention_heads']} heads read one compressed KV latent per layer"
    return f"{arch['attention']}: {arch['attention_heads']} query heads, {arch['kv_heads']} KV heads"


def _held(row: dict[str, Any]) -> str:
    return format_bytes(row["bytes"]) + (" (window-capped)" if row["window_capped"] else "")


def _capacity(plan: dict[str, Any]) -> str:
    gpu, replica = plan["per_gpu"], plan["per_replica"]
    sequence = f"KV/sequence ({plan['prompt_tokens']:,} + {plan['output_tokens']:,} tokens, {plan['kv_dtype']})"
    weights = f"- weights ({plan['weights_dtype']})"
    if plan["weights_source"] != "estimate":
        weights = "- weights (--weights-gib)"
    layout = f"TP {plan['tensor_parallel']} x PP {plan['pipeline_parallel']} = {plan['gpus']} GPU"
    table = _table(
        (f"capacity ({layout}{'s' if plan['gpus'] > 1 else ''})", "per GPU", "per replica"),
        [
            ("GPU memory", format_bytes(gpu["gpu_memory_bytes"]), format_bytes(replica["gpu_memory_bytes"])),
            (
                f"x utilization {plan['utilization']:g}",
                format_bytes(gpu["usable_bytes"]),
                format_bytes(replica["usable_bytes"]),
            ),
            (weights, format_bytes(gpu["weights_bytes"]), format_bytes(replica["weights_bytes"])),
            ("- overhead", format_bytes(gpu["overhead_bytes"]), format_bytes(replica["overhead_bytes"])),
            ("= left for KV", format_bytes(gpu["kv_budget_bytes"]), format_bytes(replica["kv_budget_bytes"])),
            ("KV tokens", f"{gpu['kv_tokens']:,}", f"{replica['kv_tokens']:,}"),
            (sequence, format_bytes(gpu["sequence_bytes"]), format_bytes(replica["sequence_bytes"])),
            ("max concurrent sequences", f"{gpu['max_sequences']:,}", f"{replica['max_sequences']:,}"),
        ],
    )
    notes = []
    if plan["pipeline_parallel"] > 1:
        layers = plan["stages"][gpu["stage"]]["layers"]
        notes.append(f"(per GPU: a GPU of pipeline stage {gpu['stage']} ({layers} layers), the replica's tightest)")
    if gpu["kv_budget_bytes"] == 0:
        notes.append("(weights and overhead leave no memory for KV: a larger card, more cards or smaller weights)")
    return "\n".join([table, *notes])


def _per_gpu_kv(shard: dict[str, Any], arch: dict[str, Any], kv_dtype: str) -> str:
    layout = f"TP {shard['tensor_parallel']} x PP {shard['pipeline_parallel']}"
    if shard["mla_latent_replicated"]:
        heads = "the whole MLA latent (every TP rank caches it)"
    elif shard["kv_heads"] is None:
        heads = "the MLA latent"
    elif shard["kv_heads_replicated"]:
        heads = (
            f"1 KV head ({arch['kv_heads']} KV heads < TP {shard['tensor_parallel']}: "
            f"each is replicated on {shard['tensor_parallel'] // arch['kv_heads']} GPUs)"
        )
    else:
        heads = f"{shard['kv_heads']} KV heads ({arch['kv_heads']} / {shard['tensor_parallel']})"
    return (
        f"per GPU ({layout}): {shard['layers']} layers x {heads} = "
        f"{format_bytes(shard['bytes_per_token'])}/token ({kv_dtype})"
    )


def _smallest_tensor_parallel(answer: dict[str, Any], plan: dict[str, Any]) -> str:
    tokens = plan["prompt_tokens"] + plan["output_tokens"]
    question = (
        f"smallest --tensor-parallel on this {format_bytes(plan['gpu_memory_bytes'])} card "
        f"(--pipeline-parallel {plan['pipeline_parallel']}) for {answer['concurrency']:,} concurrent "
        f"sequence{'s' if answer['concurrency'] > 1 else ''} of {tokens:,} tokens"
    )
    tried = ", ".join(f"TP {row['tensor_parallel']}: {row['max_sequences']:,}" for row in answer["tried"])
    if answer["tensor_parallel"] is None:
        return f"{question}: none of the sizes this model splits into (sequences {tried})"
    return f"{question}: {answer['tensor_parallel']} (sequences {tried})"


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Columns under a rule: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[column]) for row in [headers, *rows]) for column in range(len(headers))]

    def line(cells: tuple[str, ...]) -> str:
        rest = "".join(f"  {cell:>{width}}" for cell, width in zip(cells[1:], widths[1:], strict=True))
        return f"{cells[0]:<{widths[0]}}{rest}"

    return "\n".join([line(headers).rstrip(), "-" * (sum(widths) + 2 * (len(widths) - 1)), *map(line, rows)])
