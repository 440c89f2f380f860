"""What a served request would cost at a vendor's list prices, and what its cache hits saved.

Vendors bill cached input tokens at a discount (and some a surcharge for writing the cache).
``observability.pricing`` gives per model, in currency units per million tokens: ``input``,
``cached_input``, ``cache_write`` (default: ``input``, no surcharge) and ``output``. A request's
prompt splits into cached tokens (the engine's ``cached_tokens``), billed at ``cached_input``, and
the rest, computed and written to the cache, billed at ``cache_write``; its output at ``output``.
Savings are what the cached tokens would have cost at ``input`` less what they cost.
"""

from dataclasses import dataclass

from pydantic import Field

from gateway.config_section import ConfigSection

PER_TOKENS = 1_000_000


class ModelPrice(ConfigSection):
    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    cache_write: float | None = Field(None, ge=0)
    output: float = Field(ge=0)


@dataclass(frozen=True)
class RequestCost:
    cost: float
    savings: float


def request_cost(price: ModelPrice, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> RequestCost:
    cached = min(max(cached_tokens, 0), prompt_tokens)
    written = prompt_tokens - cached
    write_price = price.input if price.cache_write is None else price.cache_write
    cost = cached * price.cached_input + written * write_price + completion_tokens * price.output
    savings = cached * (price.input - price.cached_input)
    return RequestCost(cost / PER_TOKENS, savings / PER_TOKENS)
