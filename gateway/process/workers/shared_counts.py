"""Every worker's tenant counts, held by the parent of `kvgate gateway --workers N`.

The same rules as one gateway's own counts (gateway/admission/local_limiter.py): a tenant's
concurrent slots, and token buckets of one minute's worth for its requests and tokens per minute.
The caps come with each call, so a reload needs nothing here; a bucket whose rate changed starts
again full, as on a single gateway. Slots are leases of a connection (one per worker): dropping
the connection frees them.
"""

import time
from collections.abc import Callable

from gateway.admission.parent_wire import CONCURRENCY, OK, REQUESTS, TOKENS
from gateway.admission.token_bucket import TokenBucket


class SharedCounts:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.in_flight: dict[str, int] = {}
        """Per tenant: slots held by every worker together."""
        self._leases: dict[int, dict[int, str]] = {}
        """Per connection: its leases, each with its tenant."""
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}

    @property
    def leases(self) -> int:
        return sum(len(leases) for leases in self._leases.values())

    def take_slot(
        self, connection: int, lease: int, tenant: str, max_concurrency: int, requests_per_minute: int
    ) -> tuple[int, float]:
        """(OK, 0) with the slot taken, else (CONCURRENCY, in flight) or (REQUESTS, wait in seconds)."""
        in_flight = self.in_flight.get(tenant, 0)
        if max_concurrency and in_flight >= max_concurrency:
            return CONCURRENCY, in_flight
        if requests_per_minute:
            wait_s = self._bucket(self._requests, tenant, requests_per_minute).try_take(1)
            if wait_s > 0:
                return REQUESTS, wait_s
        self.in_flight[tenant] = in_flight + 1
        self._leases.setdefault(connection, {})[lease] = tenant
        return OK, 0

    def free_slot(self, connection: int, lease: int) -> None:
        """Free a lease; one already freed (its connection was dropped before) is ignored."""
        tenant = self._leases.get(connection, {}).pop(lease, None)
        if tenant is not None:
            self._release(tenant)

    def take_tokens(self, tenant: str, tokens: int, per_minute: int) -> tuple[int, float]:
        """(OK, 0) with the tokens taken, else (TOKENS, wait in seconds)."""
        wait_s = self._bucket(self._tokens, tenant, per_minute).try_take(tokens)
        return (TOKENS, wait_s) if wait_s > 0 else (OK, 0)

    def give_back(self, tenant: str, tokens: int, per_minute: int) -> None:
        self._bucket(self._tokens, tenant, per_minute).give_back(tokens)

    def drop(self, connection: int) -> int:
        """Free every lease of a connection that closed; how many there were."""
        leases = self._leases.pop(connection, {})
        for tenant in leases.values():
            self._release(tenant)
        return len(leases)

    def _release(self, tenant: str) -> None:
        left = self.in_flight[tenant] - 1
        if left:
            self.in_flight[tenant] = left
        else:
            del self.in_flight[tenant]

    def _bucket(self, buckets: dict[str, TokenBucket], tenant: str, per_minute: int) -> TokenBucket:
        bucket = buckets.get(tenant)
        if bucket is None or bucket.per_minute != per_minute:
            bucket = buckets[tenant] = TokenBucket(per_minute, self._clock)
        return bucket
