"""The `limits:`, `tenants:`, `admin:` and `shared_state:` sections of config.yaml.

Secrets (API keys) may be written inline or as environment references (`${ENV:NAME}` or
`env:NAME`); they are resolved when the config is loaded and kept as `SecretStr`, so a config
that is printed or logged never shows them.
"""

import os
import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from gateway.config_section import ConfigSection

_ENV_REFERENCE = re.compile(r"^(?:\$\{ENV:(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|env:(?P<plain>[A-Za-z_][A-Za-z0-9_]*))$")


def resolve_secret(value: str) -> str:
    """An inline secret as is, or the value of the environment variable it refers to."""
    match = _ENV_REFERENCE.match(value.strip())
    if match is None:
        return value
    name = match["braced"] or match["plain"]
    resolved = os.environ.get(name)
    if not resolved:
        raise ValueError(f"environment variable {name} is not set or empty")
    return resolved


class TokenCaps(ConfigSection):
    """Per-request token caps; a field left unset inherits from the level above."""

    max_prompt_tokens: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    max_tokens_policy: Literal["reject", "clamp"] | None = None
    """What a request asking for more than `max_tokens` gets: a 400, or the cap."""
    context_length: int | None = Field(None, ge=1)
    """Prompt + max_tokens bound; unset means what the model's replicas report (`max_model_len`)."""
    max_n: int | None = Field(None, ge=1)
    """Most samples (`n`) one request may ask for; unset: the API's own bound (128)."""
    max_embedding_input_tokens: int | None = Field(None, ge=1)
    """Tokens of all inputs of one embeddings request together."""

    def over(self, base: "TokenCaps") -> "TokenCaps":
        """These caps where set, ``base`` elsewhere."""
        return base.model_copy(update=self.model_dump(exclude_none=True))


class LimitsConfig(TokenCaps):
    """Caps for every model (the fields inherited from TokenCaps), per model, and the admission queue."""

    models: dict[str, TokenCaps] = {}
    max_embedding_input_tokens: int | None = Field(300_000, ge=1)
    """OpenAI's own bound on the tokens of one embeddings request."""
    max_queue: int = Field(256, ge=0)
    """Requests that may wait for a replica with room; one more gets 429."""
    queue_timeout_s: float = Field(30.0, gt=0)
    max_messages: int = Field(2048, ge=1)
    max_content_chars: int = Field(1_000_000, ge=1)
    """Characters of one message's content (all its text parts) or of a completions prompt."""
    max_json_depth: int = Field(32, ge=2)
    max_json_containers: int = Field(50_000, ge=16)
    """Objects and arrays in one request body, counted on the raw bytes before it is parsed."""
    max_json_values: int = Field(200_000, ge=16)
    """Values in the objects and arrays of one request body (token ids count one each), counted the same way."""
    max_json_keys: int = Field(50_000, ge=16)
    """Object keys in one request body, counted the same way (a key costs about five values to parse)."""
    max_tools: int = Field(128, ge=0)

    def caps_for(self, model: str) -> TokenCaps:
        base = TokenCaps.model_validate(self.model_dump(include=set(TokenCaps.model_fields)))
        override = self.models.get(model)
        return override.over(base) if override else base


class TenantConfig(ConfigSection):
    name: str = Field(min_length=1)
    api_keys: list[SecretStr] = Field(min_length=1)
    max_concurrency: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    """Prompt + completion tokens per minute (a token bucket of one minute's worth)."""
    requests_per_minute: int | None = Field(None, ge=1)
    """Requests admitted per minute (a bucket of one minute's worth, one request each)."""
    isolate_cache: bool = False
    """Give this tenant its own cache salt: no other tenant can hit (or time) its cached prefixes."""
    priority: int = 0
    """Admission class: higher classes leave the queue first, and the lowest is shed first under overload."""
    max_header_priority: int | None = None
    """When set, the tenant may pick a class per request with `x-kvgate-priority: N` (N <= this)."""
    limits: TokenCaps = TokenCaps()

    @field_validator("api_keys", mode="before")
    @classmethod
    def _resolve_keys(cls, keys: object) -> object:
        if not isinstance(keys, list):
            return keys
        return [resolve_secret(key) if isinstance(key, str) else key for key in keys]


class AdminConfig(ConfigSection):
    api_key: SecretStr | None = None
    """Bearer key for /admin/* and the dashboard; without one they answer loopback clients only."""

    @field_validator("api_key", mode="before")
    @classmethod
    def _resolve_key(cls, key: object) -> object:
        return resolve_secret(key) if isinstance(key, str) else key


class SharedStateConfig(ConfigSection):
    """Tenant limits counted in one Redis for every gateway (see docs/admission.md, "Several gateways")."""

    redis_url: str
    """redis://[user:password@]HOST:PORT/DB (rediss:// for TLS, unix:///path?db=N); `${ENV:NAME}` allowed."""
    on_unavailable: Literal["local", "reject"] = "local"
    """While Redis does not answer: admit on this gateway's own counts (local), or answer 503 (reject)."""
    lease_s: float = Field(5.0, ge=0.5, le=300)
    """A request's concurrency slot expires this long after its gateway last renewed it (a crashed gateway's slots come back)."""
    timeout_s: float = Field(0.25, gt=0, le=10)
    """Longest wait for one Redis call (connect or answer) before Redis counts as unavailable."""
    key_prefix: str = Field("kvgate", min_length=1)
    """Prefix of every key, so several deployments can share one Redis."""

    @field_validator("redis_url", mode="before")
    @classmethod
    def _resolve_url(cls, url: object) -> object:
        if not isinstance(url, str):
            return url
        url = resolve_secret(url)
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return url
