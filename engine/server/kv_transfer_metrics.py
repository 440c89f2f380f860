"""The KV connector's counters, beside the engine's (``kvgate:*``: vLLM has no such metrics)."""

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

DIRECTIONS = ("pulled", "served")
"""pulled: blocks this (decode) engine received; served: blocks this (prefill) engine sent."""
FALLBACKS = ("unreachable", "refused", "mismatch", "timeout", "error")
"""Why a decode engine prefilled locally after all: the prefill engine could not be reached, it no
longer held the transfer, its blocks did not match (layout, hashes), it was too slow, or the
connection broke mid-pull."""


class TransferMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        blocks = Counter(
            "kvgate:kv_transfer_blocks", "KV blocks moved between engines.", ["model_name", "direction"],
            registry=registry,
        )  # fmt: skip
        moved = Counter(
            "kvgate:kv_transfer_bytes", "KV bytes moved between engines.", ["model_name", "direction"],
            registry=registry,
        )  # fmt: skip
        self.blocks = {direction: blocks.labels(model_name, direction) for direction in DIRECTIONS}
        self.bytes = {direction: moved.labels(model_name, direction) for direction in DIRECTIONS}
        fallbacks = Counter(
            "kvgate:kv_transfer_fallbacks", "Decode requests that prefilled locally after a failed pull.",
            ["model_name", "reason"], registry=registry,
        )  # fmt: skip
        self.fallbacks = {reason: fallbacks.labels(model_name, reason) for reason in FALLBACKS}
        self.holds_expired = Counter(
            "kvgate:kv_transfer_holds_expired", "Held transfers freed because no pull came in time.",
            ["model_name"], registry=registry,
        ).labels(model_name)  # fmt: skip
        self.held_blocks = Gauge(
            "kvgate:kv_transfer_held_blocks", "Blocks pinned for decode engines that have not pulled them yet.",
            ["model_name"], registry=registry,
        ).labels(model_name)  # fmt: skip

    def track_held(self, held_blocks: Callable[[], int]) -> None:
        self.held_blocks.set_function(held_blocks)

    def moved(self, direction: str, num_blocks: int, num_bytes: int) -> None:
        self.blocks[direction].inc(num_blocks)
        self.bytes[direction].inc(num_bytes)
