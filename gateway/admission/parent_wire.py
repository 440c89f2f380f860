"""The wire between a worker's limiter and the parent that counts for every worker on the host.

One unix stream socket per worker, in the parent's private folder (mode 0700). Each frame is a
4-byte big-endian length and a msgpack array. A worker asks:

- ``[TAKE_SLOT, call, lease, tenant, max_concurrency, requests_per_minute]`` (0: no cap);
- ``[FREE_SLOT, lease]`` (no answer);
- ``[TAKE_TOKENS, call, tenant, tokens, tokens_per_minute]``;
- ``[GIVE_BACK, tenant, tokens, tokens_per_minute]`` (no answer; negative takes more);
- ``[IN_FLIGHT, call, [tenant, ...]]``;

and the parent answers ``[call, verdict, detail]``: ``OK``, or ``CONCURRENCY`` with the tenant's
requests in flight, ``TOKENS`` or ``REQUESTS`` with the seconds until the take would fit. Leases
are numbered by the worker and belong to its connection: when it closes (the worker died), the
parent frees them all.
"""

import asyncio
from typing import Any

import msgspec

TAKE_SLOT, FREE_SLOT, TAKE_TOKENS, GIVE_BACK, IN_FLIGHT = range(5)
OK, CONCURRENCY, TOKENS, REQUESTS = range(4)
MAX_FRAME = 1 << 20
"""The longest frame either side reads; a longer length is a broken peer."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list)


def frame(message: list[Any]) -> bytes:
    payload = _encoder.encode(message)
    return len(payload).to_bytes(4, "big") + payload


async def read_frame(reader: asyncio.StreamReader) -> list[Any]:
    """The next message; raises ``asyncio.IncompleteReadError`` at the end of the stream and
    ``ValueError`` on a frame that is too long or not a msgpack array."""
    size = int.from_bytes(await reader.readexactly(4), "big")
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    try:
        return _decoder.decode(await reader.readexactly(size))
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from exc
