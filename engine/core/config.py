"""Everything one engine replica is started with (built from the ``kvgate engine`` flags)."""

from dataclasses import dataclass

from engine.core.kv_transfer_config import KVTransferConfig
from engine.core.session_retention import (
    DEFAULT_MAX_SESSION_TTL_S,
    DEFAULT_SESSION_RETAIN_FRACTION,
    DEFAULT_SESSION_TTL_S,
)
from engine.model.lora_modules import DEFAULT_MAX_LORA_RANK, LoRAModule
from engine.sim.sim_runner import SimCosts

DEFAULT_MODEL = "smollm2-135m"
MAX_DEFAULT_MODEL_LEN = 8192
DEFAULT_CPU_KV_CACHE_GIB = 1.0
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
AUTO_DTYPE = "float32"
"""What ``--dtype auto`` runs: the fastest dtype whose greedy output equals transformers' float32
``generate`` on the reference prompts. Measured on CPU (AMD EPYC with AVX512-BF16): bfloat16
diverges within 32 tokens on 4 of the ten prompts on the oneDNN path and 7 on the portable one
(``tests/engine/test_model_runner.py`` fails if it stops diverging), so auto is float32 on every
CPU (and on CUDA, not measured there); its kernels still follow the CPU (``engine/model/kernel_choice.py``)."""


@dataclass(frozen=True)
class EngineConfig:
    model: str = DEFAULT_MODEL
    served_model_name: str = DEFAULT_MODEL
    host: str = "127.0.0.1"
    port: int = 8100
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_gib: float | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str = "auto"
    device: str = "cpu"
    dtype: str = "auto"
    """One of DTYPE_CHOICES; ``model_dtype`` is the one the model runs in."""
    threads: int | None = None
    """CPU threads for the forward pass; None leaves torch's default (all cores)."""
    max_model_len: int | None = None
    """None: the model's context length, capped at MAX_DEFAULT_MODEL_LEN."""
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    host_kv_blocks: int | None = None
    host_kv_gib: float | None = None
    """The host-memory KV tier, in blocks or GiB (neither: no host tier)."""
    session_ttl_s: float = DEFAULT_SESSION_TTL_S
    """A session (``kvgate_session``) is active this long after its latest turn."""
    max_session_ttl_s: float = DEFAULT_MAX_SESSION_TTL_S
    """The longest TTL a request may ask for (``kvgate_session_ttl_s``, ``prompt_cache_retention: 24h``)."""
    session_retain_fraction: float = DEFAULT_SESSION_RETAIN_FRACTION
    """At most this fraction of the device pool is retained for active sessions' latest turns."""
    kv_events: str | None = None
    kv_events_topic: str = "kv-events"
    kv_events_replay: str | None = None
    """ROUTER endpoint answering KV-event replay requests (with --kv-events)."""
    kv_events_buffer_steps: int = 10_000
    load_events: str | None = None
    """PUB endpoint of the replica's load reports."""
    load_events_interval_s: float = 0.05
    sim_costs: SimCosts | None = None
    """Set in simulated mode: the cost model that replaces the forward pass."""
    sim_host_bandwidth_gbs: float | None = None
    """Simulated mode: host-tier copy bandwidth; None keeps the preset's host_copy_per_token_s."""
    check_invariants: bool = False
    kv_transfer: KVTransferConfig | None = None
    """``--kv-transfer-config``: the KV connector for disaggregated prefill/decode; None: off."""
    otlp_traces_endpoint: str | None = None
    """OTLP/HTTP collector URL for the engine's trace spans; None: no export."""
    log_level: str = "INFO"
    lora_modules: tuple[LoRAModule, ...] = ()
    """LoRA adapters served beside the base model; a request names one as its ``model``."""
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    max_loras: int | None = None
    """Most distinct adapters among running sequences (vLLM's ``--max-loras``); None: no limit.
    vLLM defaults to 1 because it preallocates that many adapter slots on the GPU; this engine
    keeps every adapter loaded, so a limit only costs batching, and mixed steps stay the default."""

    @property
    def sim(self) -> bool:
        return self.sim_costs is not None

    @property
    def model_dtype(self) -> str:
        """The dtype of weights and activations, with 'auto' resolved (AUTO_DTYPE)."""
        return AUTO_DTYPE if self.dtype == "auto" else self.dtype

    @property
    def kv_dtype(self) -> str:
        """The KV storage dtype with 'auto' resolved to the model dtype."""
        return self.model_dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
