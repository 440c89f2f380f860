"""The base of every gateway config section: unknown keys are errors, so a typo never passes silently."""

from pydantic import BaseModel, ConfigDict


class ConfigSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
