"""``kvgate plan``: KV-cache arithmetic for a model, and how many sequences fit on a card."""

import argparse
import sys

import orjson

from planner.arch import ModelArch
from planner.capacity import CapacityPlan, plan_capacity, smallest_tensor_parallel
from planner.kv_math import BITS_PER_ELEMENT
from planner.load import load_arch, preset_names
from planner.parallel import Parallelism
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
    add(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="GPUs each layer is split over (KV heads split too, replicated when fewer than N) (default 1)",
    )
    add(
        "--pipeline-parallel",
        type=int,
        default=1,
        metavar="M",
        help="pipeline stages the layers are split over; a replica spans N x M GPUs (default 1)",
    )
    add(
        "--weights-gib",
        type=float,
        metavar="GIB",
        help="weights of the whole model in GiB, instead of the estimate from the config "
        "(needed for the capacity table when the config lacks MLP fields)",
    )
    add(
        "--concurrency",
        type=int,
        metavar="C",
        help="sequences that must fit at once, for the smallest --tensor-parallel line (default 1)",
    )
    add("--json", action="store_true", help="print the same numbers as JSON")
    return parser  # fmt: skip


def _capacity(arch: ModelArch, args: argparse.Namespace) -> CapacityPlan | str:
    """The plan, or why there is none: the config lacks a weights field and no --weights-gib."""
    prompt_tokens = max(arch.max_context - args.output_tokens, 0) if args.context is None else args.context
    if prompt_tokens + args.output_tokens > arch.max_context:
        raise ValueError(
            f"--context {prompt_tokens:,} + --output-tokens {args.output_tokens:,} exceeds the model's "
            f"maximum context of {arch.max_context:,} tokens"
        )
    if args.weights_gib is None and arch.params is None:
        return f"{arch.params_missing}; give --weights-gib for the capacity table"
    return plan_capacity(
        arch,
        gpu_memory_bytes=args.gpu_memory,
        prompt_tokens=prompt_tokens,
        output_tokens=args.output_tokens,
        kv_dtype=args.kv_dtype,
        weights_dtype=args.weights_dtype,
        utilization=args.utilization,
        overhead_bytes=int(args.overhead_gib * GIB),
        parallel=Parallelism(args.tensor_parallel, args.pipeline_parallel),
        weights_given_bytes=None if args.weights_gib is None else int(args.weights_gib * GIB),
    )


def main(argv: list[str]) -> int:
    """Run ``kvgate plan``. Bad input prints a message on stderr and ends with status 2: returned for
    a model or plan that cannot be read, raised as SystemExit by argparse for malformed flags."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    capacity_flags = (args.context, args.weights_gib, args.concurrency, args.output_tokens or None)
    if args.gpu_memory is None and any(flag is not None for flag in capacity_flags):
        parser.error(
            "--context, --output-tokens, --weights-gib and --concurrency apply to the capacity table: "
            "give --gpu-memory too"
        )
    if min(args.overhead_gib, args.output_tokens, args.context or 0, args.weights_gib or 0) < 0:
        parser.error("--overhead-gib, --context, --output-tokens and --weights-gib must be >= 0")
    if min(args.tensor_parallel, args.pipeline_parallel, args.concurrency or 1) < 1:
        parser.error("--tensor-parallel, --pipeline-parallel and --concurrency must be >= 1")
    parallel = Parallelism(args.tensor_parallel, args.pipeline_parallel)
    try:
        arch = load_arch(args.model)
        parallel.check(arch)
        capacity = None if args.gpu_memory is None else _capacity(arch, args)
        smallest = None
        if isinstance(capacity, CapacityPlan):
            smallest = smallest_tensor_parallel(arch, capacity, args.concurrency or 1)
    except (ValueError, OSError) as error:
        print(f"kvgate plan: error: {error}", file=sys.stderr)
        return 2
    report = build_report(arch, args.kv_dtype, capacity, smallest, parallel)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(render_text(report))
    return 0
