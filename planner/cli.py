"""``kvgate plan``: KV-cache arithmetic for a model, and how many sequences fit on a card."""

import argparse
import sys

import orjson

from planner.arch import ModelArch
from planner.kv_math import BITS_PER_ELEMENT, CapacityPlan, plan_capacity
from planner.load import load_arch, preset_names
from planner.render import render_text
from planner.report import build_report
from planner.sizes import parse_memory_size

GIB = 1024**3


def _memory_size(text: str) -> int:
    try:
        return parse_memory_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate plan",
        description="KV-cache size per token and per sequence, and concurrent sequences per GPU.",
    )
    dtypes = ", ".join(BITS_PER_ELEMENT)
    add = parser.add_argument
    add(
        "--model",
        required=True,
        metavar="CONFIG",
        help="a config.json, a model folder, a .gguf file, the bundled smollm2-135m, "
        f"or a preset: {', '.join(preset_names())}",
    )
    add(
        "--kv-dtype",
        default="bf16",
        choices=BITS_PER_ELEMENT,
        metavar="DTYPE",
        help=f"KV-cache dtype of the per-sequence and capacity tables: {dtypes} (default bf16)",
    )
    add(
        "--gpu-memory",
        type=_memory_size,
        metavar="SIZE",
        help="memory of one GPU, e.g. 24GiB, 80GB, or 24 (GiB); adds the capacity table",
    )
    add(
        "--weights-dtype",
        default="bf16",
        choices=BITS_PER_ELEMENT,
        metavar="DTYPE",
        help="dtype of the weights, for the weights estimate (default bf16)",
    )
    add(
        "--utilization",
        type=float,
        default=0.9,
        metavar="FRACTION",
        help="share of GPU memory the engine may use, as vLLM's gpu_memory_utilization (default 0.9)",
    )
    add(
        "--overhead-gib",
        type=float,
        default=2.0,
        metavar="GIB",
        help="GiB kept back for activations, CUDA graphs and allocator slack (default 2)",
    )
    add(
        "--context",
        type=int,
        metavar="N",
        help="prompt tokens per sequence (default: the model's max context minus the output tokens)",
    )
    add(
        "--output-tokens",
        type=int,
        default=0,
        metavar="M",
        help="generated tokens per sequence, whose KV is held too (default 0)",
    )
    add("--json", action="store_true", help="print the same numbers as JSON")
    return parser  # fmt: skip


def _capacity(arch: ModelArch, args: argparse.Namespace) -> CapacityPlan:
    prompt_tokens = max(arch.max_context - args.output_tokens, 0) if args.context is None else args.context
    if prompt_tokens + args.output_tokens > arch.max_context:
        raise ValueError(
            f"--context {prompt_tokens:,} + --output-tokens {args.output_tokens:,} exceeds the model's "
            f"maximum context of {arch.max_context:,} tokens"
        )
    return plan_capacity(
        arch,
        gpu_memory_bytes=args.gpu_memory,
        prompt_tokens=prompt_tokens,
        output_tokens=args.output_tokens,
        kv_dtype=args.kv_dtype,
        weights_dtype=args.weights_dtype,
        utilization=args.utilization,
        overhead_bytes=int(args.overhead_gib * GIB),
    )


def main(argv: list[str]) -> int:
    """Run ``kvgate plan``. Bad input prints a message on stderr and ends with status 2: returned for
    a model or plan that cannot be read, raised as SystemExit by argparse for malformed flags."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.gpu_memory is None and (args.context is not None or args.output_tokens):
        parser.error("--context and --output-tokens size the capacity table: give --gpu-memory too")
    if min(args.overhead_gib, args.output_tokens, args.context or 0) < 0:
        parser.error("--overhead-gib, --context and --output-tokens must be >= 0")
    try:
        arch = load_arch(args.model)
        capacity = None if args.gpu_memory is None else _capacity(arch, args)
    except (ValueError, OSError) as error:
        print(f"kvgate plan: error: {error}", file=sys.stderr)
        return 2
    report = build_report(arch, args.kv_dtype, capacity)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(render_text(report))
    return 0
