"""The narrow view of a tenant that a limiter reads and counts in: its name, caps and usage counters.

Limiters take this view, not the whole ``Tenant`` (which holds them), so the two never import each other.
"""

from dataclasses import dataclass
from typing import Protocol

from gateway.admission.config import TenantConfig
from gateway.admission.token_bucket import TokenBucket


@dataclass
class TenantUsage:
    """What a tenant uses on this gateway right now; kept across config reloads."""

    in_flight: int = 0
    tokens: TokenBucket | None = None
    """The tokens-per-minute bucket (counted here by the local limiter only)."""
    requests: TokenBucket | None = None
    """The requests-per-minute bucket (counted here by the local limiter only)."""


class TenantCounters(Protocol):
    """What a limiter needs of a tenant: who it is, its caps, and the counters it updates."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> TenantConfig | None: ...

    @property
    def usage(self) -> TenantUsage: ...

    @property
    def limited(self) -> bool:
        """Whether any of concurrency, tokens or requests per minute is capped."""
        ...
