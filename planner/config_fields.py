"""Typed reads from a HF ``config.json`` dict, with errors that name the missing field."""

from typing import Any


class ConfigFieldError(ValueError):
    """A config lacks a field the planner needs, or holds a value of the wrong kind."""


def require_int(config: dict[str, Any], field: str, needed_for: str) -> int:
    """The positive integer ``config[field]``; ``needed_for`` says why, for the error message."""
    value = optional_int(config, field)
    if value is None:
        raise ConfigFieldError(f"config is missing {field!r} (needed for {needed_for})")
    return value


def optional_int(config: dict[str, Any], field: str) -> int | None:
    """``config[field]`` as a positive integer, or None when absent or null."""
    value = config.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigFieldError(f"config field {field!r} must be a positive integer, got {value!r}")
    return value
