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
    if "capacity" in report:
        sections.append(_capacity(report["capacity"]))
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
    facts.append(("parameters", f"{arch['parameters'] / 1e9:.3f} B"))
    return "\n".join(f"{name:<15}{value}" for name, value in facts)


def _attention(arch: dict[str, Any]) -> str:
    if arch["attention"] == "MLA":
        return f"MLA: {arch['attention_heads']} heads read one compressed KV latent per layer"
    return f"{arch['attention']}: {arch['attention_heads']} query heads, {arch['kv_heads']} KV heads"


def _held(row: dict[str, Any]) -> str:
    return format_bytes(row["bytes"]) + (" (window-capped)" if row["window_capped"] else "")


def _capacity(plan: dict[str, Any]) -> str:
    sequence = f"KV/sequence ({plan['prompt_tokens']:,} + {plan['output_tokens']:,} tokens, {plan['kv_dtype']})"
    table = _table(
        ("capacity", ""),
        [
            ("GPU memory", format_bytes(plan["gpu_memory_bytes"])),
            (f"x utilization {plan['utilization']:g}", format_bytes(plan["usable_bytes"])),
            (f"- weights ({plan['weights_dtype']})", format_bytes(plan["weights_bytes"])),
            ("- overhead", format_bytes(plan["overhead_bytes"])),
            ("= left for KV", format_bytes(plan["kv_budget_bytes"])),
            (sequence, format_bytes(plan["sequence_bytes"])),
            ("max concurrent sequences", f"{plan['max_sequences']:,}"),
        ],
    )
    if plan["kv_budget_bytes"] == 0:
        return f"{table}\n(weights and overhead leave no memory for KV: a larger card, more cards or smaller weights)"
    return table


def _table(headers: tuple[str, str], rows: list[tuple[str, str]]) -> str:
    """Two columns under a rule: the first left-aligned, the second right-aligned."""
    left = max(len(cell) for cell in [headers[0], *(row[0] for row in rows)])
    right = max(len(cell) for cell in [headers[1], *(row[1] for row in rows)])
    lines = [f"{headers[0]:<{left}}  {headers[1]:>{right}}".rstrip(), "-" * (left + 2 + right)]
    lines += [f"{first:<{left}}  {second:>{right}}" for first, second in rows]
    return "\n".join(lines)
