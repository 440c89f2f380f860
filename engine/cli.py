"""``kvgate engine``: one bundled engine replica (real model, or ``--sim`` cost model) over HTTP."""

import argparse
import dataclasses
import logging
import sys

import zmq
from aiohttp import web

from engine.core.block_manager import BlockManager
from engine.core.config import AUTO_DTYPE, DEFAULT_MODEL, DTYPE_CHOICES, MAX_DEFAULT_MODEL_LEN, EngineConfig
from engine.core.host_kv_pool import GIB, host_kv_blocks
from engine.core.kv_budget import KVBudget, KVBudgetError, plan_kv_budget
from engine.core.kv_events import DEFAULT_BUFFER_STEPS, DEFAULT_TOPIC, KVEventPublisher
from engine.core.kv_transfer_blocks import BlockIO, SimBlockIO
from engine.core.kv_transfer_config import KVTransferConfig, KVTransferConfigError, parse_kv_transfer_config
from engine.core.llm_engine import LLMEngine
from engine.core.metrics import EngineMetrics
from engine.core.scheduler import Scheduler
from engine.core.session_retention import (
    DEFAULT_MAX_SESSION_TTL_S,
    DEFAULT_SESSION_RETAIN_FRACTION,
    DEFAULT_SESSION_TTL_S,
    SessionRetention,
)
from engine.model.lora_modules import (
    DEFAULT_MAX_LORA_RANK,
    AdapterConfig,
    LoRAError,
    LoRAModule,
    check_modules,
    parse_lora_module,
)
from engine.model.runner_api import ModelRunner
from engine.server.kv_connector import KvgateConnector
from engine.server.load_publisher import DEFAULT_INTERVAL_S, LoadPublisher
from engine.server.server import EngineServer
from engine.sim.sim_runner import SIM_PRESETS, SIM_TEXT, SimCosts, SimRunner
from normalize.chat_tokenizer import ChatTokenizer
from normalize.model_files import ModelNotFoundError
from planner.arch import ModelArch
from planner.load import load_arch
from protocol.tracing import configure_tracing, otlp_exporter

log = logging.getLogger("kvgate.engine")

_SHUTDOWN_GRACE_S = 5.0
"""On SIGTERM/SIGINT, requests in flight get this long to finish before they are cut."""

_SIM_COST_FLAGS: dict[str, str] = {
    field.name: f"--sim-{field.name.replace('_', '-')}" for field in dataclasses.fields(SimCosts)
}


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def kv_transfer_config(text: str) -> KVTransferConfig:
    try:
        return parse_kv_transfer_config(text)
    except KVTransferConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def lora_module(text: str) -> LoRAModule:
    try:
        return parse_lora_module(text)
    except LoRAError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate engine",
        description="Run one bundled paged-cache engine replica with an OpenAI-compatible API.",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model", default=DEFAULT_MODEL, help="bundled model name, a .gguf file or an HF folder (default: %(default)s)"
    )
    model.add_argument("--served-model-name", help="name clients send as 'model' (default: the --model value)")
    model.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs (default: %(default)s)"
    )
    model.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads for the forward pass (default: all cores); use 1 per replica when several share few cores",
    )
    model.add_argument(
        "--dtype", choices=DTYPE_CHOICES, default="auto",
        help=f"weights and activations dtype; auto = the fastest one greedy-identical to transformers ({AUTO_DTYPE}); "
        "bfloat16 is faster where oneDNN bfloat16 works (AVX512-BF16, AMX) but not token-identical, and runs on "
        "the portable path (F.linear, SDPA) elsewhere (default: %(default)s)",
    )  # fmt: skip
    model.add_argument(
        "--max-model-len", type=positive_int,
        help=f"longest prompt + output in tokens (default: the model's context, at most {MAX_DEFAULT_MODEL_LEN})",
    )  # fmt: skip

    lora = parser.add_argument_group("LoRA adapters", "PEFT LoRA adapters served beside the base model, per request")
    lora.add_argument(
        "--lora-modules", nargs="+", type=lora_module, default=[], metavar="NAME=PATH",
        help="adapters as NAME=PATH (or vLLM's JSON form {\"name\": ..., \"path\": ...}); PATH is a PEFT folder "
        "(adapter_config.json + adapter_model.safetensors); a request runs under one by sending its NAME as model",
    )  # fmt: skip
    lora.add_argument(
        "--max-lora-rank", type=positive_int, default=DEFAULT_MAX_LORA_RANK,
        help="largest adapter rank accepted; a higher one stops the engine at start-up (default: %(default)s)",
    )  # fmt: skip
    lora.add_argument(
        "--max-loras", type=positive_int,
        help="most distinct adapters in one step (vLLM's flag); a request for another adapter waits until a running "
        "one drains (default: no limit, every loaded adapter may share a step; vLLM's default is 1)",
    )  # fmt: skip
    lora.add_argument(
        "--enable-lora", action="store_true",
        help="accepted for vLLM command-line compatibility: adapters are enabled by --lora-modules",
    )  # fmt: skip

    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    server.add_argument("--port", type=positive_int, default=8100, help="port to listen on (default: %(default)s)")
    server.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity (default: %(default)s)",
    )

    cache = parser.add_argument_group("KV cache")
    cache.add_argument(
        "--block-size", type=positive_int, default=16,
        help="tokens per KV block; must match the gateway's block_size (default: %(default)s)",
    )  # fmt: skip
    sizing = cache.add_mutually_exclusive_group()
    sizing.add_argument("--num-blocks", type=positive_int, help="exact number of KV blocks")
    sizing.add_argument("--kv-cache-gib", type=positive_float, help="KV cache size in GiB (default on CPU: 1)")
    sizing.add_argument(
        "--gpu-memory-utilization", type=positive_float,
        help="CUDA only: fraction of GPU memory for weights + KV (default on CUDA: 0.9)",
    )  # fmt: skip
    cache.add_argument(
        "--kv-cache-dtype", choices=["auto", "bfloat16", "float16", "fp8"], default="auto",
        help="KV storage dtype; auto = --dtype, fp8 = e4m3 with a per-block scale (default: %(default)s)",
    )  # fmt: skip
    host_tier = cache.add_mutually_exclusive_group()
    host_tier.add_argument(
        "--host-kv-blocks", type=positive_int,
        help="host-memory KV tier of this many blocks: evicted blocks are copied there, and copied back on a hit",
    )  # fmt: skip
    host_tier.add_argument("--host-kv-gib", type=positive_float, help="host-memory KV tier size in GiB")
    cache.add_argument(
        "--session-ttl-s", type=positive_float, default=DEFAULT_SESSION_TTL_S,
        help="a kvgate_session stays active (its latest turn evicted last) this long (default: %(default)s)",
    )  # fmt: skip
    cache.add_argument(
        "--max-session-ttl-s", type=positive_float, default=DEFAULT_MAX_SESSION_TTL_S,
        help="longest session TTL a request may ask for (prompt_cache_retention 24h, cache_control ttl); "
        "longer ones are capped (default: %(default)s)",
    )  # fmt: skip
    cache.add_argument(
        "--session-retain-fraction", type=fraction, default=DEFAULT_SESSION_RETAIN_FRACTION,
        help="most of the device pool that active sessions' latest turns may hold back (default: %(default)s)",
    )  # fmt: skip
    cache.add_argument(
        "--kv-events", metavar="tcp://HOST:PORT", help="publish KV events (vLLM format) on a ZMQ PUB socket bound here"
    )
    cache.add_argument(
        "--kv-events-topic", default=DEFAULT_TOPIC, help="topic frame of published KV events (default: %(default)s)"
    )
    cache.add_argument(
        "--kv-events-replay", metavar="tcp://HOST:PORT",
        help="answer KV-event replay requests (vLLM's ROUTER shape; a snapshot of the cache when the "
        "buffer does not reach back) on a socket bound here; needs --kv-events",
    )  # fmt: skip
    cache.add_argument(
        "--kv-events-buffer-steps", type=positive_int, default=DEFAULT_BUFFER_STEPS,
        help="event batches kept for replay (default: %(default)s)",
    )  # fmt: skip
    server.add_argument(
        "--load-events", metavar="tcp://HOST:PORT",
        help="publish the replica's load (running, waiting, queued prefill tokens) on a ZMQ PUB socket bound here",
    )  # fmt: skip
    server.add_argument(
        "--load-events-interval-s", type=positive_float, default=DEFAULT_INTERVAL_S,
        help="seconds between load messages (default: %(default)s)",
    )  # fmt: skip
    cache.add_argument(
        "--otlp-traces-endpoint",
        help="export OpenTelemetry spans (queue, prefill, decode) over OTLP/HTTP to this URL, e.g. "
        "http://127.0.0.1:4318/v1/traces (needs opentelemetry-exporter-otlp-proto-http; default: off)",
    )

    cache.add_argument(
        "--kv-transfer-config", type=kv_transfer_config, metavar="JSON",
        help="vLLM's flag: turn on the KV connector for disaggregated prefill/decode, e.g. '{\"kv_role\": "
        "\"kv_both\"}'; keys kv_connector (KvgateConnector), kv_role, kv_ip, kv_port, engine_id, "
        "kv_connector_extra_config {hold_timeout_s, pull_timeout_s, sim_bandwidth_gbs} (docs/engine.md)",
    )  # fmt: skip

    batching = parser.add_argument_group("batching")
    batching.add_argument(
        "--max-num-seqs", type=positive_int, default=64, help="most sequences in one step (default: %(default)s)"
    )
    batching.add_argument(
        "--max-num-batched-tokens", type=positive_int, default=2048,
        help="token budget of one step; longer prompts are prefilled in chunks (default: %(default)s)",
    )  # fmt: skip
    batching.add_argument(
        "--check-invariants",
        action="store_true",
        help="assert the block manager's invariants after every step (tests, debugging)",
    )

    sim = parser.add_argument_group(
        "simulated mode",
        "replace the forward pass by a cost model (no torch); step time = overhead + prefill tokens x cost + decode batch cost",
    )
    sim.add_argument("--sim", action="store_true", help="run the cost model instead of the real model")
    sim.add_argument(
        "--sim-preset",
        choices=sorted(SIM_PRESETS),
        default="smollm2-cpu",
        help="cost constants to start from (default: %(default)s)",
    )
    for name, flag in _SIM_COST_FLAGS.items():
        sim.add_argument(flag, type=float, dest=f"sim_{name}", metavar="SECONDS", help=f"override the preset's {name}")
    sim.add_argument(
        "--sim-host-bandwidth-gbs", type=positive_float, metavar="GB/S",
        help="host-tier copy bandwidth: sets host_copy_per_token_s from the model's KV bytes per token",
    )  # fmt: skip
    return parser


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    sim_costs = None
    if args.sim:
        given = {name: getattr(args, f"sim_{name}") for name in _SIM_COST_FLAGS}
        overrides = {name: value for name, value in given.items() if value is not None}
        sim_costs = dataclasses.replace(SIM_PRESETS[args.sim_preset], **overrides)
    return EngineConfig(
        model=args.model,
        served_model_name=args.served_model_name or args.model,
        host=args.host,
        port=args.port,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        kv_cache_gib=args.kv_cache_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_dtype=args.kv_cache_dtype,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        host_kv_blocks=args.host_kv_blocks,
        host_kv_gib=args.host_kv_gib,
        session_ttl_s=args.session_ttl_s,
        max_session_ttl_s=args.max_session_ttl_s,
        session_retain_fraction=args.session_retain_fraction,
        kv_events=args.kv_events,
        kv_events_topic=args.kv_events_topic,
        kv_events_replay=args.kv_events_replay,
        kv_events_buffer_steps=args.kv_events_buffer_steps,
        load_events=args.load_events,
        load_events_interval_s=args.load_events_interval_s,
        sim_costs=sim_costs,
        sim_host_bandwidth_gbs=args.sim_host_bandwidth_gbs,
        check_invariants=args.check_invariants,
        kv_transfer=args.kv_transfer_config,
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        log_level=args.log_level,
        lora_modules=tuple(args.lora_modules),
        max_lora_rank=args.max_lora_rank,
        max_loras=args.max_loras,
    )


def build_runner(
    config: EngineConfig,
    budget: KVBudget,
    tokenizer: ChatTokenizer,
    host_blocks: int,
    adapters: tuple[AdapterConfig, ...] = (),
) -> ModelRunner:
    """The cost model (which reads no adapter weights), or the real model with its adapters loaded and checked."""
    if config.sim_costs is not None:
        costs = config.sim_costs
        if config.sim_host_bandwidth_gbs is not None:
            per_token = budget.bytes_per_token / (config.sim_host_bandwidth_gbs * 1e9)
            costs = dataclasses.replace(costs, host_copy_per_token_s=per_token)
        return SimRunner(config.block_size, budget.num_blocks, costs, tokenizer.encode_text(SIM_TEXT))
    import torch

    from engine.model.malloc_arena import keep_large_blocks_in_heap, use_one_malloc_arena
    from engine.model.model_runner import TorchModelRunner
    from engine.model.omp_team import on_short_lived_thread

    if config.device == "cpu":
        use_one_malloc_arena()
        keep_large_blocks_in_heap()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    return on_short_lived_thread(
        lambda: TorchModelRunner(
            config.model,
            config.block_size,
            budget.num_blocks,
            config.device,
            config.model_dtype,
            config.kv_cache_dtype,
            host_blocks,
            adapters,
        )
    )


def plan_budget(config: EngineConfig, arch: ModelArch) -> KVBudget:
    if config.device != "cuda" or config.sim:
        return plan_kv_budget(config, arch)
    import torch

    return plan_kv_budget(config, arch, torch.cuda.mem_get_info)


def build_server(config: EngineConfig) -> EngineServer:
    adapters = tuple(check_modules(config.lora_modules, config.served_model_name, config.max_lora_rank))
    arch = load_arch(config.model)
    budget = plan_budget(config, arch)
    log.info("%s", budget.describe())
    bytes_per_block = budget.bytes_per_token * config.block_size
    host_blocks = host_kv_blocks(config.host_kv_blocks, config.host_kv_gib, bytes_per_block)
    if host_blocks:
        log.info("host KV tier: %d blocks = %.2f GiB", host_blocks, host_blocks * bytes_per_block / GIB)
    tokenizer = ChatTokenizer.load(config.model)
    runner = build_runner(config, budget, tokenizer, host_blocks, adapters)
    retention = SessionRetention(
        int(config.session_retain_fraction * budget.num_blocks),
        config.session_ttl_s,
        max_ttl_s=config.max_session_ttl_s,
    )
    block_manager = BlockManager(budget.num_blocks, config.block_size, config.served_model_name, host_blocks, retention)
    scheduler = Scheduler(block_manager, config.max_num_seqs, config.max_num_batched_tokens, config.max_loras)
    max_lora = (config.max_loras or len(adapters)) if adapters else None
    metrics = EngineMetrics(
        config.served_model_name, config.block_size, budget.num_blocks, host_blocks, config.kv_cache_dtype, max_lora
    )
    publisher = None
    if config.kv_events:
        publisher = KVEventPublisher(
            config.kv_events, config.kv_events_topic, config.kv_events_replay, config.kv_events_buffer_steps
        )
    engine = LLMEngine(runner, scheduler, tokenizer.tokenizer, metrics, publisher, config.check_invariants)
    connector = None
    if config.kv_transfer is not None:
        connector = KvgateConnector(config.kv_transfer, block_io(config, budget, runner), metrics.registry,
                                    config.served_model_name)  # fmt: skip
        connector.attach(engine)
    load_publisher = None
    if config.load_events:
        load_publisher = LoadPublisher(config.load_events, engine.load, config.load_events_interval_s)
        engine.on_admitted = load_publisher.nudge
        engine.announce_prompts = True
    return EngineServer(
        engine,
        tokenizer,
        config.served_model_name,
        budget.max_model_len,
        load_publisher,
        model_root=config.model,
        lora_modules=config.lora_modules,
        connector=connector,
    )


def block_io(config: EngineConfig, budget: KVBudget, runner: ModelRunner) -> BlockIO:
    """How the KV connector reads and writes blocks: sized bytes over a bandwidth in ``--sim``, the pool's bytes otherwise."""
    assert config.kv_transfer is not None
    if config.sim:
        return SimBlockIO(budget.bytes_per_token, config.block_size, config.kv_transfer.sim_bandwidth_gbs)
    from engine.server.kv_transfer_torch import torch_block_io

    return torch_block_io(runner)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.kv_events_replay and not args.kv_events:
        parser.error("--kv-events-replay needs --kv-events")
    config = config_from_args(args)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if config.otlp_traces_endpoint:
            configure_tracing("kvgate-engine", otlp_exporter(config.otlp_traces_endpoint))
        server = build_server(config)
    except (KVBudgetError, ModelNotFoundError, LoRAError, zmq.ZMQError, RuntimeError) as exc:
        print(f"kvgate engine: {exc}", file=sys.stderr)
        return 2
    mode = "simulated" if config.sim else f"{config.device}/{config.model_dtype}"
    log.info("serving %s (%s) on http://%s:%d", config.served_model_name, mode, config.host, config.port)
    web.run_app(
        server.build_app(),
        host=config.host,
        port=config.port,
        handler_cancellation=True,
        shutdown_timeout=_SHUTDOWN_GRACE_S,
        print=None,
        access_log=None,
    )
    return 0
