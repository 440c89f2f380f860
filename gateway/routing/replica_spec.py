"""A backend replica as the router knows it from the config."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    model: str
    kv_events: str | None
    """ZMQ endpoint of the replica's KV events: precise mode; None: predicted mode."""
    capacity_blocks: int | None
    """KV blocks (of the gateway's block size) the replica's cache holds, when known."""
    kv_events_replay: str | None = None
    """ZMQ endpoint of its KV-event replay socket, asked on start and on sequence gaps."""


def known_capacity(spec: ReplicaSpec, default_blocks: int | None) -> int | None:
    """The replica's KV capacity in blocks: its own, else the configured default (None: unknown)."""
    return spec.capacity_blocks or default_blocks
