"""Which of a gateway's requests a replica's load report already counts.

A gateway adds a replica's load report to the requests it sent since (gateway/backends/load_view.py),
so it must tell the requests a report counts from those it does not. Guessing by time (a request
sent 20 ms before the report arrived is in it) counted a request twice when the replica took it in
and reported at once, and not at all when its intake was slower. So each of the gateway's views
numbers its requests to the replica, ``x-kvgate-load-mark: <origin>:<ordinal>``, and the bundled
engine's report says the latest ordinal of each origin it has counted (``ReplicaLoad.arrivals``).
Requests can overtake one another (parallel connections, tokenizing in threads), so a mark is the
latest, not a guarantee for every earlier ordinal: the error is one request, for the moment it is
overtaken, where the grace could be a burst's worth.
"""

from typing import NamedTuple

LOAD_MARK_HEADER = "x-kvgate-load-mark"

LOAD_MARK_TTL_S = 60.0
"""A replica forgets an origin none of whose requests arrived for this long (a gateway restarted,
or a backend left its pool); the gateway takes a request of its own this old as counted either way."""

MAX_ORIGINS = 64
"""A replica reports at most this many origins, the latest heard: a load message stays small
whatever the headers sent to it."""


class LoadMark(NamedTuple):
    origin: str
    """The sending view's random id (a gateway process's view of one replica)."""
    ordinal: int
    """The request's number among that view's, from 1."""

    def header(self) -> dict[str, str]:
        return {LOAD_MARK_HEADER: f"{self.origin}:{self.ordinal}"}


def parse_load_mark(value: str | None) -> LoadMark | None:
    """The header's mark; None for a missing or malformed one (the request is counted all the same,
    only not acknowledged)."""
    if value is None:
        return None
    origin, _, ordinal = value.partition(":")
    if not origin or len(origin) > 32 or not ordinal.isascii() or not ordinal.isdigit() or len(ordinal) > 18:
        return None
    return LoadMark(origin, int(ordinal))
