"""What a reload may not do without saying so: remove every backend or turn authentication off.

Such a file is far more often a mistake (cut off while being written, the wrong file, a section
deleted by accident) than an intent, and applying it is costly: every request answered 503, or
every client, keyed or not, served and billed to nobody. So a reload that would do either is
refused with the running config kept, unless it names the change in ``allow``:

- ``no_backends``: the new file has no backend where the running one had some;
- ``no_auth``: the new file has no tenants where the running one had some (the API becomes open
  to anyone), or no admin key where the running one had one (admin endpoints fall back to
  loopback clients only).
"""

from collections.abc import Iterable

from gateway.config import ConfigError, KvgateConfig
from gateway.errors import bad_request

ALLOWANCES = ("no_backends", "no_auth")

ReloadAllowance = frozenset[str]


class UnsafeReload(ConfigError):
    """A valid config whose changes the reload did not explicitly allow."""


def parse_allowance(values: Iterable[str]) -> ReloadAllowance:
    """``allow`` query values (repeated or comma-separated) as a set; 400 naming an unknown one."""
    names = frozenset(name.strip() for value in values for name in value.split(",") if name.strip())
    unknown = sorted(names - set(ALLOWANCES))
    if unknown:
        raise bad_request(
            f"Unknown allow value(s): {', '.join(unknown)}; known: {', '.join(ALLOWANCES)}.",
            param="allow",
            code="invalid_value",
        )
    return names


def check_safe(running: KvgateConfig, new: KvgateConfig, source: str, allow: ReloadAllowance) -> None:
    """Raise UnsafeReload when ``new`` removes every backend or authentication and ``allow`` does
    not name that change."""
    refused = [(needed, reason) for needed, reason in _dangers(running, new) if needed not in allow]
    if refused:
        needed = ",".join(sorted({needed for needed, _ in refused}))
        raise UnsafeReload(
            f"reload of {source} refused, the running config stays: "
            + "; ".join(reason for _, reason in refused)
            + f". If that is intended, reload with POST /admin/reload?allow={needed}"
        )


def _dangers(running: KvgateConfig, new: KvgateConfig) -> list[tuple[str, str]]:
    """(the allowance it needs, why) for each dangerous change from ``running`` to ``new``."""
    dangers = []
    if running.backends and not new.backends:
        dangers.append(
            ("no_backends", f"it has no backends (running: {len(running.backends)}), so every request would get 503")
        )
    if running.tenants and not new.tenants:
        dangers.append(
            (
                "no_auth",
                f"it has no tenants (running: {len(running.tenants)}), so requests without an API key would be served",
            )
        )
    if running.admin.api_key is not None and new.admin.api_key is None:
        dangers.append(
            ("no_auth", "it has no admin.api_key, so admin endpoints would answer loopback clients without a key")
        )
    return dangers
