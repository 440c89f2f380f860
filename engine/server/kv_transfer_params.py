"""A request's ``kv_transfer_params`` (vLLM's NixlConnector shape), checked.

Prefill leg: ``{"do_remote_decode": true, ...}``: prefill, then hold the prompt's blocks for a
decode engine. Decode leg: ``{"do_remote_prefill": true, "remote_engine_id", "remote_request_id",
"remote_block_ids", "remote_host", "remote_port", ...}``: pull the blocks this engine lacks,
then decode. Neither flag set: an ordinary request. A decode leg without a host or port (a
prefill leg that never answered) prefills locally. Wrong types are a 400 naming the field.
"""

from dataclasses import dataclass
from typing import Any

from engine.server.kv_transfer_client import PullTarget
from protocol.openai_errors import bad_request

FIELD = "kv_transfer_params"


@dataclass(frozen=True)
class TransferRequest:
    remote_decode: bool = False
    """Prefill leg: hold the blocks after prefill."""
    source: PullTarget | None = None
    """Decode leg: where to pull from (None: prefill locally)."""
    num_remote_blocks: int = 0


NO_TRANSFER = TransferRequest()
"""A request without ``kv_transfer_params`` (or with neither flag set)."""


def transfer_request(value: Any) -> TransferRequest:
    if value is None:
        return NO_TRANSFER
    if not isinstance(value, dict):
        raise bad_request(f"{FIELD} must be an object", FIELD)
    remote_decode = _flag(value, "do_remote_decode")
    remote_prefill = _flag(value, "do_remote_prefill")
    if remote_decode and remote_prefill:
        raise bad_request(f"{FIELD}: do_remote_decode and do_remote_prefill cannot both be true", FIELD)
    if not remote_prefill:
        return TransferRequest(remote_decode=remote_decode) if remote_decode else NO_TRANSFER
    host = _typed(value, "remote_host", str)
    port = _typed(value, "remote_port", int)
    transfer_id = _typed(value, "remote_request_id", str)
    block_ids = _typed(value, "remote_block_ids", list)
    if host is None or port is None or transfer_id is None or block_ids is None:
        return NO_TRANSFER
    return TransferRequest(source=PullTarget(host, port, transfer_id), num_remote_blocks=len(block_ids))


def _flag(value: dict[str, Any], key: str) -> bool:
    flag = value.get(key, False)
    if flag is None:
        return False
    if not isinstance(flag, bool):
        raise bad_request(f"{FIELD}.{key} must be a boolean", f"{FIELD}.{key}")
    return flag


def _typed(value: dict[str, Any], key: str, kind: type) -> Any:
    found = value.get(key)
    if found is not None and (not isinstance(found, kind) or isinstance(found, bool)):
        raise bad_request(f"{FIELD}.{key} must be a {kind.__name__}", f"{FIELD}.{key}")
    return found
