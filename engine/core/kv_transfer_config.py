"""``--kv-transfer-config``: vLLM's flag and JSON keys, read for the bundled KV connector.

``{"kv_role": "kv_both"}`` alone turns the connector on. Keys (vLLM's names): ``kv_connector``
(only ``KvgateConnector``, the default), ``kv_role`` (``kv_producer``, ``kv_consumer``,
``kv_both``: every role serves both legs here, as vLLM's NixlConnector wants ``kv_both``),
``kv_ip`` / ``kv_port`` (where the prefill side serves pulls; port 0 or none: a free port, which
the prefill answer names), ``engine_id`` and ``kv_connector_extra_config``
(``hold_timeout_s``, ``pull_timeout_s``, ``sim_bandwidth_gbs``). Any other key is an error
naming it: a setting the engine cannot honour is never dropped silently.
"""

from dataclasses import dataclass
from typing import Any

import orjson

CONNECTOR_NAME = "KvgateConnector"
ROLES = ("kv_producer", "kv_consumer", "kv_both")
DEFAULT_KV_IP = "127.0.0.1"
DEFAULT_HOLD_TIMEOUT_S = 30.0
"""How long a prefill engine pins a finished prompt's blocks for a decode engine that has not
pulled them (vLLM's NixlConnector frees them after its abort timeout likewise). A loopback or
RDMA pull takes well under a second, so 30 s only covers a decode queued behind others; held
blocks are device memory no other request can use meanwhile."""
DEFAULT_PULL_TIMEOUT_S = 10.0
"""How long a decode engine waits for one pull before it prefills locally instead."""
DEFAULT_SIM_BANDWIDTH_GBS = 25.0
"""``--sim`` transfer bandwidth, GB/s: a 200 Gb/s RDMA NIC per GPU (ConnectX-6/7 class, what
NIXL runs over in P/D fleets) moves about 25 GB/s; NVLink within a node is far faster."""

_TOP_KEYS = {"kv_connector", "kv_role", "kv_ip", "kv_port", "engine_id", "kv_connector_extra_config"}
_EXTRA_KEYS = {"hold_timeout_s", "pull_timeout_s", "sim_bandwidth_gbs"}


class KVTransferConfigError(ValueError):
    """The flag's value is not a usable connector configuration (the message names the key)."""


@dataclass(frozen=True)
class KVTransferConfig:
    kv_role: str = "kv_both"
    kv_connector: str = CONNECTOR_NAME
    kv_ip: str = DEFAULT_KV_IP
    kv_port: int = 0
    """0: a free port chosen at start-up."""
    engine_id: str | None = None
    """None: a random id at start-up (``remote_engine_id`` in prefill answers)."""
    hold_timeout_s: float = DEFAULT_HOLD_TIMEOUT_S
    pull_timeout_s: float = DEFAULT_PULL_TIMEOUT_S
    sim_bandwidth_gbs: float = DEFAULT_SIM_BANDWIDTH_GBS


def parse_kv_transfer_config(text: str) -> KVTransferConfig:
    """The flag's JSON, checked; raises ``KVTransferConfigError`` naming what is wrong."""
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise KVTransferConfigError(f"--kv-transfer-config is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise KVTransferConfigError("--kv-transfer-config must be a JSON object")
    _no_unknown(raw, _TOP_KEYS, "--kv-transfer-config")
    connector = raw.get("kv_connector") or CONNECTOR_NAME
    if connector != CONNECTOR_NAME:
        raise KVTransferConfigError(
            f"--kv-transfer-config kv_connector {connector!r} is not available; this engine has {CONNECTOR_NAME!r}"
        )
    role = raw.get("kv_role")
    if role not in ROLES:
        raise KVTransferConfigError(f"--kv-transfer-config kv_role must be one of {', '.join(ROLES)}, not {role!r}")
    extra = raw.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise KVTransferConfigError("--kv-transfer-config kv_connector_extra_config must be a JSON object")
    _no_unknown(extra, _EXTRA_KEYS, "--kv-transfer-config kv_connector_extra_config")
    port = raw.get("kv_port", 0)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
        raise KVTransferConfigError(f"--kv-transfer-config kv_port must be a port number, not {port!r}")
    ip = raw.get("kv_ip", DEFAULT_KV_IP)
    engine_id = raw.get("engine_id")
    if not isinstance(ip, str) or not ip or (engine_id is not None and not isinstance(engine_id, str)):
        raise KVTransferConfigError("--kv-transfer-config kv_ip and engine_id must be strings")
    return KVTransferConfig(
        kv_role=role,
        kv_connector=connector,
        kv_ip=ip,
        kv_port=port,
        engine_id=engine_id,
        hold_timeout_s=_positive(extra, "hold_timeout_s", DEFAULT_HOLD_TIMEOUT_S),
        pull_timeout_s=_positive(extra, "pull_timeout_s", DEFAULT_PULL_TIMEOUT_S),
        sim_bandwidth_gbs=_positive(extra, "sim_bandwidth_gbs", DEFAULT_SIM_BANDWIDTH_GBS),
    )


def _no_unknown(raw: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise KVTransferConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _positive(extra: dict[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise KVTransferConfigError(f"kv_connector_extra_config {key} must be a positive number, not {value!r}")
    return float(value)
