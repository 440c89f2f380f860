"""config.yaml ``discovery:``: replicas the gateway finds itself, besides the ``backends:`` it is given."""

from pydantic import Field, model_validator

from gateway.backends.replica_role import ReplicaRole
from gateway.config_section import ConfigSection


class DnsDiscovery(ConfigSection):
    """The replicas are the A records of ``host`` (a Kubernetes headless Service, say), looked up
    every ``interval_s``. Each address becomes a backend named ``{name}-{address}``, reached at
    ``http://{address}:{port}``; its KV-event, replay and load sockets are ``tcp://{address}:{…_port}``
    when those ports are set (the same ports on every replica, as a StatefulSet's pods have)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    """The replicas' HTTP port."""
    model: str | None = None
    """The model the replicas serve: the top-level ``model`` (default) or one a backend declares."""
    kv_events_port: int | None = Field(None, ge=1, le=65535)
    kv_events_replay_port: int | None = Field(None, ge=1, le=65535)
    load_events_port: int | None = Field(None, ge=1, le=65535)
    interval_s: float = Field(5.0, gt=0)
    lookup_timeout_s: float = Field(3.0, gt=0)
    """A lookup that takes longer failed (the last answer stays); cluster DNS answers in milliseconds."""
    nameserver: str | None = None
    """``ADDRESS`` or ``ADDRESS:PORT`` of the DNS server to ask; absent: the system's resolvers."""
    max_concurrency: int | None = Field(None, ge=1)
    """Per replica, as a backend's ``max_concurrency``."""
    role: ReplicaRole = "both"
    """The replicas' phase in disaggregated prefill/decode (gateway/backends/replica_role.py)."""


class KubernetesDiscovery(ConfigSection):
    """The replicas are the ready Pods that a Gateway API Inference Extension ``InferencePool``
    (``inference.networking.k8s.io/v1``) selects, watched through the Kubernetes API: one backend per
    pod and target port, named ``{name}-{podIP}`` (``{name}-{podIP}-{port}`` when the pool has several
    target ports), reached at ``http://{podIP}:{port}``. Rank ``i`` (the pool's ``i``-th target port)
    has its KV-event, replay and load sockets on ``tcp://{podIP}:{…_port + i}``, as vLLM offsets them
    by data-parallel rank; with one target port that is the ports as set."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    inference_pool: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """The InferencePool's name; its ``spec.selector`` and ``spec.targetPorts`` are followed live."""
    namespace: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The pool's (and its pods') namespace; absent: the gateway pod's own (in cluster), the
    kubeconfig context's, else ``default``."""
    kubeconfig: str | None = Field(None, min_length=1)
    """A kubeconfig file (out of cluster); absent: the pod's service account (in cluster)."""
    context: str | None = Field(None, min_length=1)
    """The kubeconfig context; absent: its current context."""
    model: str | None = None
    """The model the replicas serve: the top-level ``model`` (default) or one a backend declares."""
    kv_events_port: int | None = Field(None, ge=1, le=65535)
    kv_events_replay_port: int | None = Field(None, ge=1, le=65535)
    load_events_port: int | None = Field(None, ge=1, le=65535)
    max_concurrency: int | None = Field(None, ge=1)
    role: ReplicaRole = "both"
    """The replicas' phase in disaggregated prefill/decode (gateway/backends/replica_role.py)."""
    """Per replica, as a backend's ``max_concurrency``."""

    @model_validator(mode="after")
    def _context_needs_kubeconfig(self) -> "KubernetesDiscovery":
        if self.context is not None and self.kubeconfig is None:
            raise ValueError("context names a kubeconfig context: set kubeconfig too")
        return self


class DiscoveryConfig(ConfigSection):
    dns: list[DnsDiscovery] = []
    kubernetes: list[KubernetesDiscovery] = []
    """InferencePools followed through the Kubernetes API (gateway/backends/k8s_discovery.py)."""

    @property
    def rules(self) -> list[DnsDiscovery | KubernetesDiscovery]:
        """Every rule, DNS then Kubernetes (their names share one namespace: backend names derive from them)."""
        return [*self.dns, *self.kubernetes]
