"""config.yaml ``discovery:``: replicas the gateway finds itself, besides the ``backends:`` it is given."""

from pydantic import Field

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
    nameserver: str | None = None
    """``ADDRESS`` or ``ADDRESS:PORT`` of the DNS server to ask; absent: the system's resolvers."""
    max_concurrency: int | None = Field(None, ge=1)
    """Per replica, as a backend's ``max_concurrency``."""


class DiscoveryConfig(ConfigSection):
    dns: list[DnsDiscovery] = []
