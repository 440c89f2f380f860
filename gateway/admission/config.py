"""The `limits:` and `tenants:` sections of config.yaml."""

from pydantic import BaseModel, ConfigDict


class LimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_prompt_tokens: int | None = None
    max_tokens: int | None = None


class TenantConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    api_keys: list[str] = []
