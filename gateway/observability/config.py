"""The `observability:` section of config.yaml: request log, dashboard statistics, prefix breakers."""

from pydantic import Field

from gateway.config_section import ConfigSection
from gateway.observability.pricing import ModelPrice


class ObservabilityConfig(ConfigSection):
    request_log: bool = True
    """One JSON line per request on stderr (or in `request_log_path`)."""
    request_log_path: str | None = None
    log_content: bool = False
    """Add the normalized request body to each log line. Off by default: prompts are user data."""
    stats_bucket_s: float = Field(5.0, gt=0)
    """Width of one point of the dashboard's time series."""
    stats_window_s: float = Field(900.0, gt=0)
    """How far back the dashboard's time series reach."""
    breaker_preview_chars: int = Field(40, ge=0)
    """Characters of stable text shown before a prefix breaker (0: show only the masked span)."""
    breaker_samples_per_s: float = Field(20.0, gt=0)
    """At most this many requests a second are compared for prefix breakers (each costs ~0.3 ms)."""
    pricing: dict[str, ModelPrice] = {}
    """List prices per served model (gateway/observability/pricing.py): each request's cost and
    cache savings go to the request log, /metrics and the dashboard's stats. Empty: none."""
    loop_stall_log_s: float = Field(0.25, gt=0)
    """An event-loop stall at least this long is logged with the stack the loop was running (the
    watchdog wakes every half of it). Lower it, e.g. to 0.05, to find what holds the loop."""
    otlp_traces_endpoint: str | None = None
    """OTLP/HTTP collector URL (e.g. http://127.0.0.1:4318/v1/traces) for the gateway's trace spans;
    None: no spans are exported (W3C trace context is still propagated). Read at start-up only."""
