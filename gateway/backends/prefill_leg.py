"""The prefill leg of a disaggregated request, in vLLM's NixlConnector wire format.

The gateway sends the prefill replica the client's body cut to one token, unstreamed, with
``kv_transfer_params: {"do_remote_decode": true, ...}``; the replica computes the prompt's KV,
keeps it for the decode replica to pull, and answers a normal completion whose top-level
``kv_transfer_params`` say where that KV is (``do_remote_prefill: true``, engine id, block ids,
host, port). The decode replica gets the client's original body plus those params, unchanged.
The same shapes serve vLLM's P/D fleets and kvgate's bundled engine (docs/routing.md).
"""

from dataclasses import dataclass
from typing import Any

import orjson

from protocol.usage import Usage, parse_usage

KV_TRANSFER_PARAMS = "kv_transfer_params"

REMOTE_DECODE: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What the prefill leg asks for: compute the prompt, hold its KV for a remote decode."""

_DROPPED = ("stream_options", "min_tokens")
"""Fields of the client's body the one-token prefill leg must not carry (``min_tokens`` above 1
would contradict its ``max_tokens: 1``)."""


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg's body: the client's, one token, unstreamed, one sample, KV kept for a remote decode."""
    leg = {key: value for key, value in body.items() if key not in _DROPPED}
    leg.update(max_tokens=1, stream=False, n=1)
    if "max_completion_tokens" in body:
        leg["max_completion_tokens"] = 1
    leg[KV_TRANSFER_PARAMS] = dict(REMOTE_DECODE)
    return leg


def decode_body(body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The decode leg's body: the client's, plus the prefill answer's ``kv_transfer_params`` unchanged."""
    return {**body, KV_TRANSFER_PARAMS: params}


@dataclass(frozen=True)
class PrefillAnswer:
    """What the prefill replica's 200 answer says."""

    params: dict[str, Any] | None
    """Its ``kv_transfer_params`` when they point at KV to pull (``do_remote_prefill``), else None."""
    usage: Usage | None
    """Its usage: ``cached_tokens`` is the prefill replica's own prefix hit."""


def read_prefill_answer(body: bytes) -> PrefillAnswer:
    """The transfer params and usage of a prefill replica's answer (either None when absent or malformed)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return PrefillAnswer(None, None)
    if not isinstance(answer, dict):
        return PrefillAnswer(None, None)
    params = answer.get(KV_TRANSFER_PARAMS)
    usable = isinstance(params, dict) and params.get("do_remote_prefill") is True
    return PrefillAnswer(params if usable else None, parse_usage(answer.get("usage")))


def refuses_transfer(error_body: bytes) -> bool:
    """A 4xx that names ``kv_transfer_params``: the replica runs without a KV connector (its
    configuration, not the request's content, is at fault)."""
    try:
        answer = orjson.loads(error_body)
    except orjson.JSONDecodeError:
        return False
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return False
    return error.get("param") == KV_TRANSFER_PARAMS or KV_TRANSFER_PARAMS in str(error.get("message", ""))
