"""One replica's total load as this gateway sees it: the replica's latest report plus this
gateway's own requests that the report cannot include yet.

Several gateways send to the same replicas, so only the replica knows its whole load; but its
report is up to a tenth of a second old (bundled engine) or a health-check interval (vLLM). A
request this gateway sent must be counted exactly once: a request the report already counts is in
the report; a newer one is added on top; and what a counted request has since finished (its
prefill, or the whole request) is taken off the report until the next one. Which requests a report
counts, the bundled engine says: the latest of this view's numbered requests it has taken in
(``protocol/load_mark.py``). Where a replica does not say (vLLM), a request sent ``COVER_GRACE_S``
or more before the report arrived is taken as in it. Without a fresh report, the view is this
gateway's own in-flight accounting alone, as with a single gateway.

A request added on top of a report is counted as the replica's next report will count it while
it waits: its whole prompt, cached prefix included (``Scheduler.queued_prefill_tokens``). Counted
by its uncached part, a replica whose report had not come yet looked cheaper for a burst's
followers than one whose report had: real bursts on one new prefix went 28 / 12 / 11 / 13 of 64
(bench/notes/2026-12-05-hotspot-burst-balance.md).
"""

import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.load_mark import LOAD_MARK_TTL_S, LoadMark
from protocol.replica_stats import DecodeProgress, ReplicaLoad

COVER_GRACE_S = 0.02
"""From a replica that does not acknowledge requests: a request sent less than this before a report
arrived may not have reached the replica's scheduler when it took the reading (HTTP, tokenization),
so it is counted on top of the report."""


@dataclass(eq=False)
class SentRequest:
    """One of this gateway's requests in flight at the replica."""

    sent_at: float
    mark: LoadMark
    """Sent as ``x-kvgate-load-mark``: a report that acknowledges it counts it."""
    prefill_tokens: int
    """Uncached prompt tokens still to prefill (0 once the first token came)."""
    waiting_tokens: int
    """What a report counts for it while it waits: its whole prompt (0 once the first token came,
    or where the replica is not to prefill it)."""
    covered: bool = False
    """The replica's latest report counts it."""


@dataclass(frozen=True)
class LoadNow:
    """The replica's load for routing: requests (running or queued) and prompt tokens to prefill."""

    running: int
    waiting: int
    queued_prefill_tokens: int
    prefix_waits: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Of the report's queued prefill, the prompts held behind each prefix block being computed, by
    kvgate hash: (their tokens, how many) (``ReplicaLoad.prefix_waits``)."""
    decodes: tuple[DecodeProgress, ...] | None = None
    """The report's decodes (``ReplicaLoad.decodes``); None without a fresh report that has them."""


class LoadView:
    """Counts kept in step with every send, first token, finish and report, so reading is O(1)."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_s = stale_after_s
        self.origin = secrets.token_hex(8)
        """This view's name in its requests' load marks: unique to this gateway process and replica."""
        self._ordinals = itertools.count(1)
        self.report: ReplicaLoad | None = None
        self._prefix_waits: dict[int, tuple[int, int]] = {}
        self._decodes: tuple[DecodeProgress, ...] | None = None
        self.report_received_at = 0.0
        self._clock = clock
        self._sent: set[SentRequest] = set()
        self._uncovered_requests = 0
        self._uncovered_prefill = 0
        self._covered_finished = 0
        self._covered_prefilled = 0
        self.own_requests = 0
        self.own_prefill_tokens = 0

    def on_report(self, report: ReplicaLoad) -> None:
        """A new reading from the replica: it counts the requests it acknowledges (or, from a replica
        that acknowledges none, those sent before it less a grace)."""
        now = self._clock()
        self.report = report
        self.report_received_at = now
        self._prefix_waits = {
            int.from_bytes(wait.block_hash, "big"): (wait.tokens, wait.requests) for wait in report.prefix_waits
        }
        self._decodes = tuple(report.decodes) if report.decodes is not None else None
        counts = self._counted_by(report, now)
        self._uncovered_requests = self._uncovered_prefill = 0
        self._covered_finished = self._covered_prefilled = 0
        for request in self._sent:
            request.covered = counts(request)
            if not request.covered:
                self._uncovered_requests += 1
                self._uncovered_prefill += request.waiting_tokens

    def _counted_by(self, report: ReplicaLoad, now: float) -> Callable[[SentRequest], bool]:
        if report.arrivals is None:
            sent_by = now - COVER_GRACE_S
            return lambda request: request.sent_at <= sent_by
        acknowledged, forgotten_by = report.arrivals.get(self.origin, 0), now - LOAD_MARK_TTL_S
        return lambda request: request.mark.ordinal <= acknowledged or request.sent_at <= forgotten_by

    def on_sent(self, prefill_tokens: int, waiting_tokens: int) -> SentRequest:
        mark = LoadMark(self.origin, next(self._ordinals))
        request = SentRequest(self._clock(), mark, prefill_tokens, waiting_tokens)
        self._sent.add(request)
        self.own_requests += 1
        self.own_prefill_tokens += prefill_tokens
        self._uncovered_requests += 1
        self._uncovered_prefill += waiting_tokens
        return request

    def add_prefill(self, request: SentRequest, tokens: int) -> None:
        """The replica has ``tokens`` more of the request's prompt to prefill than it was sent with (a
        disaggregated request whose prefill leg failed: the decode replica prefills it itself)."""
        request.prefill_tokens += tokens
        request.waiting_tokens += tokens
        self.own_prefill_tokens += tokens
        if request.covered:
            self._covered_prefilled -= tokens
        else:
            self._uncovered_prefill += tokens

    def on_prefilled(self, request: SentRequest) -> None:
        """The request's first token came: its prompt is no longer queued work."""
        tokens, request.prefill_tokens = request.prefill_tokens, 0
        waiting, request.waiting_tokens = request.waiting_tokens, 0
        self.own_prefill_tokens -= tokens
        if request.covered:
            self._covered_prefilled += tokens
        else:
            self._uncovered_prefill -= waiting

    def on_finished(self, request: SentRequest) -> None:
        self.on_prefilled(request)
        self._sent.discard(request)
        self.own_requests -= 1
        if request.covered:
            self._covered_finished += 1
        else:
            self._uncovered_requests -= 1

    @property
    def fresh(self) -> bool:
        return self.report is not None and self._clock() - self.report_received_at <= self.stale_after_s

    def now(self) -> LoadNow:
        """The replica's total load: its report adjusted by this gateway's requests since, or, without a
        fresh report, this gateway's own requests (all of them queued for prefill as far as it knows)."""
        report = self.report
        if report is None or not self.fresh:
            return LoadNow(self.own_requests, 0, self.own_prefill_tokens)
        finished = self._covered_finished
        running = max(report.running - finished, 0)
        waiting = max(report.waiting - max(finished - report.running, 0), 0) + self._uncovered_requests
        if report.queued_prefill_tokens is None:
            prefill = self.own_prefill_tokens
        else:
            prefill = max(report.queued_prefill_tokens - self._covered_prefilled, 0) + self._uncovered_prefill
        return LoadNow(running, waiting, prefill, self._prefix_waits, self._decodes)
