"""What Kubernetes discovery reads from API objects: an InferencePool's selector and target ports, a
Pod's readiness and address, and the backends they make. Plain functions over the API's JSON (the
dicts a list or watch returns), so the rules are tested without a cluster.

The rules are GIE's own endpoint picker's: a pod of the pool is a replica while it has an IP, is
not being deleted and its ``Ready`` condition is ``True``; each of the pool's ``targetPorts`` of
each such pod is one endpoint, ``podIP:port``.
"""

from dataclasses import dataclass

from gateway.backends.discovery_config import KubernetesDiscovery
from gateway.backends.k8s_watch import ApiObject
from gateway.config import BackendSpec


@dataclass(frozen=True)
class PoolSpec:
    """What discovery follows of an InferencePool's ``spec``."""

    match_labels: tuple[tuple[str, str], ...]
    target_ports: tuple[int, ...]

    @property
    def label_selector(self) -> str:
        """The pods' ``labelSelector`` query: every label must match (the API's ``k=v,k=v``)."""
        return ",".join(f"{key}={value}" for key, value in self.match_labels)


def pool_spec(pool: ApiObject) -> PoolSpec | None:
    """The selector and ports of an InferencePool; None when its spec has neither (the CRD requires
    both, so only a malformed object lacks them)."""
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    ports = tuple(int(port["number"]) for port in spec.get("targetPorts") or [] if "number" in port)
    if not labels or not ports:
        return None
    return PoolSpec(tuple(sorted((str(key), str(value)) for key, value in labels.items())), ports)


def ready_address(pod: ApiObject) -> str | None:
    """The pod's IP while it serves: it has one, is not being deleted, and is Ready."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    ready = any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )
    address = status.get("podIP")
    return address if ready and isinstance(address, str) and address else None


def backends_for(rule: KubernetesDiscovery, spec: PoolSpec, addresses: list[str]) -> list[BackendSpec]:
    """One backend per ready pod address and target port, sorted by address then rank."""
    several = len(spec.target_ports) > 1
    return [
        _backend(rule, address, port, rank, several)
        for address in sorted(set(addresses))
        for rank, port in enumerate(spec.target_ports)
    ]


def _backend(rule: KubernetesDiscovery, address: str, port: int, rank: int, several: bool) -> BackendSpec:
    host = f"[{address}]" if ":" in address else address

    def socket(base: int | None) -> str | None:
        return f"tcp://{host}:{base + rank}" if base is not None else None

    return BackendSpec(
        name=f"{rule.name}-{address}-{port}" if several else f"{rule.name}-{address}",
        url=f"http://{host}:{port}",
        model=rule.model,
        kv_events=socket(rule.kv_events_port),
        kv_events_replay=socket(rule.kv_events_replay_port),
        load_events=socket(rule.load_events_port),
        max_concurrency=rule.max_concurrency,
        role=rule.role,
    )
