"""The `routing:` section of config.yaml."""

from pydantic import BaseModel, ConfigDict


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str = "cache_aware"
