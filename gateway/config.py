"""config.yaml: one pydantic schema, validated at start-up and on reload.

An unknown key or a wrong type stops start-up with a message naming the key and the file.
"""

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator

from gateway.admission.config import AdminConfig, LimitsConfig, SharedStateConfig, TenantConfig, resolve_secret
from gateway.backends.discovery_config import DiscoveryConfig
from gateway.backends.replica_role import ReplicaRole
from gateway.config_section import ConfigSection
from gateway.observability.config import ObservabilityConfig
from gateway.routing.config import RoutingConfig
from normalize.config import NormalizeConfig


class ListenConfig(ConfigSection):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)


class EngineSpec(ConfigSection):
    """A bundled engine replica that `kvgate up` starts (`kvgate engine --port PORT ARGS...`)."""

    name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    model: str | None = None
    """Defaults to the top-level `model`."""
    kv_events_port: int | None = Field(None, ge=1, le=65535)
    """When set, the engine publishes KV events there and the gateway routes on them (precise mode)."""
    kv_events_replay_port: int | None = Field(None, ge=1, le=65535)
    """When set (with `kv_events_port`), the engine answers KV-event replays there, so a gateway that
    starts late or restarts learns the engine's whole cache."""
    load_events_port: int | None = Field(None, ge=1, le=65535)
    """When set, the engine publishes its load there (20 times a second) and every gateway routes on
    the replica's total load, not only on the requests it sent itself."""
    max_concurrency: int | None = Field(None, ge=1)
    role: ReplicaRole = "both"
    """Its phase in disaggregated prefill/decode (gateway/backends/replica_role.py). When any engine
    has one, `kvgate up` starts every engine with the KV connector (`--kv-transfer-config`)."""
    args: list[str] = []
    """Further `kvgate engine` flags, verbatim (e.g. ["--sim", "--num-blocks", "2048"])."""


class BackendSpec(ConfigSection):
    """A replica the gateway sends requests to: a bundled engine, vLLM or SGLang."""

    name: str
    url: str
    model: str | None = None
    """The model this replica serves; defaults to the top-level `model`."""
    tokenizer: str | None = None
    """Tokenizer for this replica's model when it differs from the top-level one."""
    max_concurrency: int | None = Field(None, ge=1)
    kv_events: str | None = None
    """ZMQ endpoint of the replica's KV events (tcp://host:port); absent means predicted mode."""
    kv_events_replay: str | None = None
    """ZMQ endpoint of its KV-event replay socket (vLLM's `replay_endpoint`, the bundled engine's
    `--kv-events-replay`): asked on start and on sequence gaps."""
    load_events: str | None = None
    """ZMQ endpoint of its load reports (the bundled engine's `--load-events`); without one the
    load comes from /stats (bundled engine) or /metrics (vLLM) at each health check."""
    kv_capacity_blocks: int | None = Field(None, ge=1)
    """Blocks of `block_size` tokens the replica's KV cache holds, when its /stats cannot tell."""
    drain: bool = False
    """Send it no new requests and let in-flight ones finish (set it and reload before maintenance)."""
    retention_hints: bool | None = None
    """Forward the client's session key (``x-session-id`` or ``user``) as ``kvgate_session`` in the
    body, so the bundled engine evicts one-shot prompts before active sessions' latest turns.
    None: only to replicas that answer the bundled engine's /stats (vLLM would ignore the field)."""
    anthropic_messages: bool = False
    """The replica serves Anthropic's ``POST /v1/messages`` itself (vLLM >= 0.10, SGLang): a Messages
    request routed here is forwarded as Anthropic's body and answered as it answers, not translated."""
    adapters: list[str] = []
    """LoRA adapters this replica serves (vLLM `--lora-modules` names); a client names one as `model`.
    Adapters the replica lists in its /v1/models (entries with a `parent`) are added to these."""
    api_key: SecretStr | None = None
    """Sent upstream as `Authorization: Bearer ...` (a remote provider): inline, or `env:NAME`."""
    api_key_env: str | None = None
    """Name of the environment variable holding the upstream key (same as `api_key: env:NAME`)."""
    headers: dict[str, str] = {}
    """Extra headers sent upstream with every request: proxied ones, health checks, /v1/models, /stats, /metrics."""
    role: ReplicaRole = "both"
    """Its phase in disaggregated prefill/decode (gateway/backends/replica_role.py)."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        return http_url(url)

    @field_validator("api_key", mode="before")
    @classmethod
    def _resolve_key(cls, key: object) -> object:
        return resolve_secret(key) if isinstance(key, str) else key

    @model_validator(mode="after")
    def _key_from_env(self) -> "BackendSpec":
        if self.api_key_env is not None:
            if self.api_key is not None:
                raise ValueError("set api_key or api_key_env, not both")
            self.api_key = SecretStr(resolve_secret(f"env:{self.api_key_env}"))
        return self

    def upstream_api_key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key is not None else None

    def upstream_headers(self) -> dict[str, str]:
        """Headers every request to this replica carries: the extra ones, then the API key."""
        key = self.upstream_api_key()
        return {**self.headers, "Authorization": f"Bearer {key}"} if key else dict(self.headers)


def http_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host (and a valid port); ValueError otherwise."""
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:  # a port that is not a number, or out of range
        valid = False
    if not valid:
        raise ValueError(f"must be an http:// or https:// URL with a host, not {url!r}")
    return url


class HealthConfig(ConfigSection):
    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    unhealthy_after: int = Field(2, ge=1)
    healthy_after: int = Field(1, ge=1)
    eject_after_failures: int = Field(3, ge=1)
    """Passive ejection: this many requests in a row failing on a replica open its circuit breaker."""
    eject_s: float = Field(5.0, gt=0)
    """How long an ejected replica rests before one probe request may try it again."""

    @property
    def report_stale_after_s(self) -> float:
        """A load read by a health check (/stats, /metrics) counts this long: three missed rounds."""
        return 3 * self.interval_s + self.timeout_s


class TimeoutsConfig(ConfigSection):
    connect_s: float = Field(2.0, gt=0)
    first_token_s: float = Field(120.0, gt=0)
    idle_stream_s: float = Field(60.0, gt=0)
    client_headers_s: float = Field(10.0, gt=0)
    """A client's request headers must arrive whole within this long (applies at start-up)."""
    client_body_s: float = Field(30.0, gt=0)
    """A client's request body must arrive whole within this long (408 otherwise). The rest of a
    body the gateway answered early is read and dropped for no longer than this (at most 10 s)."""


class KvgateConfig(ConfigSection):
    listen: ListenConfig = ListenConfig()
    workers: int = Field(1, ge=1, le=64)
    """Gateway processes sharing the listen port (SO_REUSEPORT); their metrics and admin views are summed."""
    model: str = "smollm2-135m"
    """The model name clients send."""
    model_aliases: dict[str, str] = {}
    """Other names clients may send, each for a served model or adapter (rewritten before forwarding).
    A target that is neither a model nor a declared adapter resolves once a replica lists it in /v1/models."""
    tokenizer: str | None = None
    """Bundled model name, GGUF file or HF folder whose tokenizer and chat template the gateway uses."""
    block_size: int = Field(16, ge=1)
    engines: list[EngineSpec] = []
    backends: list[BackendSpec] = []
    discovery: DiscoveryConfig = DiscoveryConfig()
    """Replicas found at run time (DNS, Kubernetes InferencePools), added to ``backends``; see docs/configuration.md."""
    routing: RoutingConfig = RoutingConfig()
    limits: LimitsConfig = LimitsConfig()
    normalize: NormalizeConfig = NormalizeConfig()
    tenants: list[TenantConfig] = []
    admin: AdminConfig = AdminConfig()
    shared_state: SharedStateConfig | None = None
    """Redis that makes tenant limits global across gateways; absent: every limit is this process's own."""
    health: HealthConfig = HealthConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _derive_backends(self) -> "KvgateConfig":
        if not self.backends:
            self.backends = [backend_for_engine(index, engine) for index, engine in enumerate(self.engines)]
        names = [backend.name for backend in self.backends]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"backend names must be unique; repeated: {', '.join(duplicates)}")
        served = set(self.models) | {adapter for backend in self.backends for adapter in backend.adapters}
        for alias in self.model_aliases:
            if alias in served:
                raise ValueError(f"model_aliases: {alias!r} is already a model or adapter name")
        without_events = [
            backend.name for backend in self.backends if backend.kv_events_replay and not backend.kv_events
        ]
        if without_events:
            raise ValueError(f"kv_events_replay needs kv_events; missing on: {', '.join(without_events)}")
        self._require_precise_mode_when_shared()
        self._check_discovery()
        return self

    def _check_discovery(self) -> None:
        rules = self.discovery.rules
        names = [rule.name for rule in rules]
        if len(set(names)) != len(names):
            raise ValueError("discovery: rule names must be unique across dns and kubernetes")
        unknown = [rule.name for rule in rules if rule.model is not None and rule.model not in self.models]
        if unknown:
            raise ValueError(
                f"discovery {', '.join(unknown)}: model must be the top-level model or one a backend declares"
            )
        predicted = [rule.name for rule in rules if rule.kv_events_port is None]
        if self.shared_state is not None and predicted:
            raise ValueError(f"several gateways (shared_state) need kv_events_port on discovery {', '.join(predicted)}")

    def _require_precise_mode_when_shared(self) -> None:
        """Several gateways (``shared_state``) route as one only on the replicas' KV events: predicted
        entries are each gateway's guesses from the 1/G of the traffic it routes (docs/routing.md)."""
        predicted = [backend.name for backend in self.backends if not backend.kv_events]
        if self.shared_state is not None and predicted:
            raise ValueError(
                "several gateways (shared_state) need precise mode: set kv_events on every backend; "
                f"missing on: {', '.join(predicted)} (see docs/routing.md, several gateways)"
            )

    def backend_model(self, backend: BackendSpec) -> str:
        return backend.model or self.model

    @property
    def models(self) -> list[str]:
        """Every model name served, the top-level one first."""
        names = [self.model] + [self.backend_model(backend) for backend in self.backends]
        return list(dict.fromkeys(names))


def engine_name(index: int, engine: EngineSpec) -> str:
    return engine.name or f"engine-{index}"


def _zmq_endpoint(host: str, port: int | None) -> str | None:
    return f"tcp://{host}:{port}" if port else None


def backend_for_engine(index: int, engine: EngineSpec) -> BackendSpec:
    return BackendSpec(
        name=engine_name(index, engine),
        url=f"http://{engine.host}:{engine.port}",
        model=engine.model,
        max_concurrency=engine.max_concurrency,
        kv_events=_zmq_endpoint(engine.host, engine.kv_events_port),
        kv_events_replay=_zmq_endpoint(engine.host, engine.kv_events_replay_port) if engine.kv_events_port else None,
        load_events=_zmq_endpoint(engine.host, engine.load_events_port),
        role=engine.role,
    )


class ConfigError(ValueError):
    """The config file is missing, not YAML, or does not match the schema."""


def parse_config(data: Any, source: str) -> KvgateConfig:
    """Validate a parsed YAML document; errors name each bad key and the source."""
    try:
        return KvgateConfig.model_validate(data or {})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"]) or "(top level)"
            message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
            problems.append(f"  {key}: {message}")
        raise ConfigError(f"invalid config {source}:\n" + "\n".join(problems)) from None


def load_config(path: str | Path, whole_file: bool = False) -> KvgateConfig:
    """Read, parse and validate ``path``. An empty or comment-only file is refused (it would be
    every default: no backends, no tenants, no admin key). ``whole_file`` (reloads) also refuses a
    file whose last line has no newline: a file cut off mid-write."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {path} is not UTF-8 text") from None
    if whole_file and text and not text.endswith("\n"):
        raise ConfigError(
            f"config {path} does not end with a newline, so it may have been cut off while being written; "
            "the running config stays (add the final newline to reload it)"
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if data is None:
        raise ConfigError(f"config {path} is empty (nothing but blanks or comments); refused")
    return parse_config(data, str(path))
