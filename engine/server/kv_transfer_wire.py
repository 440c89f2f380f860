"""The pull protocol's framing: a msgpack header, length-prefixed, then raw block bytes.

Every message is a 4-byte big-endian header length, the msgpack header, and, where the header
says ``payload_bytes`` > 0, that many raw bytes (block after block, ``bytes_per_block`` each).

Decode -> prefill: ``PullRequest`` (op "pull": send blocks ``first .. first + count`` of the
hold; op "release": the decode side needs nothing, free the hold now). Prefill -> decode:
``PullReply`` (``ok`` false with ``error`` when the hold is unknown, expired, or does not match).
"""

import asyncio
import struct

import msgspec

MAX_HEADER_BYTES = 1 << 20
_LENGTH = struct.Struct(">I")


class PullRequest(msgspec.Struct, frozen=True):
    op: str
    """"pull" or "release"."""
    transfer_id: str
    first: int = 0
    count: int = 0
    block_hashes: list[bytes] = []
    """The hashes the decode side computed for blocks ``first .. first + count``."""
    layout: str = ""
    """The decode side's KV layout (dtype and shape of a block): bytes are only sent to a match."""


class PullReply(msgspec.Struct, frozen=True):
    ok: bool
    error: str = ""
    layout: str = ""
    bytes_per_block: int = 0
    count: int = 0
    payload_bytes: int = 0


class WireError(ConnectionError):
    """The peer sent something that is not a message of this protocol."""


_encoder = msgspec.msgpack.Encoder()


def encode(message: PullRequest | PullReply) -> bytes:
    header = _encoder.encode(message)
    return _LENGTH.pack(len(header)) + header


async def read_request(reader: asyncio.StreamReader) -> PullRequest:
    header = await _read_header(reader)
    try:
        return msgspec.msgpack.decode(header, type=PullRequest)
    except msgspec.DecodeError as exc:
        raise WireError(f"not a pull request: {exc}") from None


async def read_reply(reader: asyncio.StreamReader) -> PullReply:
    header = await _read_header(reader)
    try:
        return msgspec.msgpack.decode(header, type=PullReply)
    except msgspec.DecodeError as exc:
        raise WireError(f"not a pull reply: {exc}") from None


async def _read_header(reader: asyncio.StreamReader) -> bytes:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_HEADER_BYTES:
        raise WireError(f"a {length}-byte header is past the {MAX_HEADER_BYTES}-byte limit")
    return await reader.readexactly(length)
