"""A replica's load as one gateway sees it: its report plus this gateway's requests, each counted once."""

from gateway.backends.load_view import COVER_GRACE_S, LoadNow, LoadView
from protocol.load_mark import LOAD_MARK_TTL_S
from protocol.replica_stats import DecodeProgress, PrefixWait, ReplicaLoad, decode_load, encode_load
from radix.hashing import hash_to_bytes
from tests.routing.helpers import Clock


def report(running: int, waiting: int, queued: int | None) -> ReplicaLoad:
    return ReplicaLoad(ts=0.0, running=running, waiting=waiting, queued_prefill_tokens=queued)


def test_without_a_report_the_view_is_this_gateways_own() -> None:
    view = LoadView(1.0, Clock(100.0))
    view.on_sent(300, 300)
    assert view.now() == LoadNow(1, 0, 300)


def test_a_request_is_counted_once_across_reports() -> None:
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    view.on_report(report(2, 0, 0))
    sent = view.on_sent(300, 300)
    assert view.now() == LoadNow(2, 1, 300), "sent after the report: on top of it"
    clock.now += COVER_GRACE_S * 2
    view.on_report(report(3, 0, 300))
    assert view.now() == LoadNow(3, 0, 300), "the new report counts it: not twice"
    view.on_prefilled(sent)
    assert view.now() == LoadNow(3, 0, 0), "its prefill is done: off the report's queue until the next"
    view.on_finished(sent)
    assert view.now() == LoadNow(2, 0, 0)
    view.on_report(report(2, 0, 0))
    assert view.now() == LoadNow(2, 0, 0)


def test_a_request_sent_just_before_a_report_is_not_assumed_in_it() -> None:
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    view.on_sent(100, 100)
    clock.now += COVER_GRACE_S / 2
    view.on_report(report(0, 0, 0))
    assert view.now() == LoadNow(0, 1, 100)


def acknowledging(view: LoadView, ordinal: int, running: int, waiting: int, queued: int) -> ReplicaLoad:
    """A bundled engine's report that counts this view's requests up to ``ordinal``."""
    return ReplicaLoad(
        ts=0.0, running=running, waiting=waiting, queued_prefill_tokens=queued, arrivals={view.origin: ordinal}
    )


def test_a_report_counts_exactly_the_requests_it_acknowledges_however_soon_it_comes() -> None:
    """The engine takes a request in and reports at once: by the clock alone it is counted on top of
    a report that holds it (twice); a report that has not taken in a request sent long ago lacks it."""
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    first, second = view.on_sent(100, 100), view.on_sent(200, 200)
    assert (first.mark.ordinal, second.mark.ordinal) == (1, 2)
    clock.now += COVER_GRACE_S / 10
    view.on_report(acknowledging(view, 1, 0, 1, 100))
    assert view.now() == LoadNow(0, 2, 300), "the first in the report, the second on top: each once"
    clock.now += 1.0
    view.on_report(acknowledging(view, 1, 0, 1, 100))
    assert view.now() == LoadNow(0, 2, 300), "the second, a second old, is still not in the report"
    view.on_report(acknowledging(view, 2, 0, 2, 300))
    assert view.now() == LoadNow(0, 2, 300)
    view.on_finished(first)
    assert view.now() == LoadNow(0, 1, 200)


def test_another_views_marks_acknowledge_nothing_of_this_ones() -> None:
    clock = Clock(100.0)
    view, other = LoadView(1.0, clock), LoadView(1.0, clock)
    assert view.origin != other.origin
    view.on_sent(100, 100)
    clock.now += 1.0
    view.on_report(acknowledging(other, 5, 0, 5, 500))
    assert view.now() == LoadNow(0, 6, 600)


def test_a_request_older_than_the_replicas_memory_of_its_origin_is_taken_as_counted() -> None:
    """A replica forgets an origin it has not heard from for ``LOAD_MARK_TTL_S``: a request of this
    view that old, still running there, is in its report all the same."""
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    view.on_sent(0, 0)
    clock.now += LOAD_MARK_TTL_S + 1
    view.on_report(ReplicaLoad(ts=0.0, running=1, waiting=0, queued_prefill_tokens=0, arrivals={}))
    assert view.now() == LoadNow(1, 0, 0)


def test_on_top_of_a_report_a_request_counts_whole_as_the_report_will_count_it() -> None:
    """A follower of a cached (or in-flight) prefix has 128 of its 2,176 tokens to compute; the
    replica's report counts a waiting prompt whole. Counted 128 until its report came, its replica
    looked cheaper than one whose report had come, and a real burst piled onto it."""
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    view.on_report(report(1, 0, 0))
    sent = view.on_sent(128, 2_176)
    assert view.now() == LoadNow(1, 1, 2_176)
    view.on_prefilled(sent)
    assert view.now() == LoadNow(1, 1, 0)
    alone = LoadView(1.0, Clock(100.0))
    alone.on_sent(128, 2_176)
    assert alone.now() == LoadNow(1, 0, 128), "no report: the gateway's own estimate, its uncached part"


def test_a_stale_report_falls_back_to_own_accounting() -> None:
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    view.on_report(report(5, 5, 5000))
    view.on_sent(40, 40)
    clock.now += 2.0
    assert view.now() == LoadNow(1, 0, 40)


def test_vllm_reports_without_queued_tokens_use_own_prefill() -> None:
    view = LoadView(1.0, Clock(100.0))
    view.on_report(report(4, 2, None))
    view.on_sent(70, 70)
    assert view.now() == LoadNow(4, 3, 70)


def test_prefill_added_after_the_send_is_counted_once_covered_or_not() -> None:
    """A decode replica whose prefill leg failed prefills the prompt itself: its queue grows, then
    empties at its first token, whether or not its last report counted the request."""
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    view.on_report(report(0, 0, 0))
    uncovered = view.on_sent(0, 0)
    view.add_prefill(uncovered, 400)
    assert view.now() == LoadNow(0, 1, 400)
    clock.now += COVER_GRACE_S * 2
    view.on_report(report(1, 0, 0))
    covered = view.on_sent(0, 0)
    clock.now += COVER_GRACE_S * 2
    view.on_report(report(2, 0, 0))
    view.add_prefill(covered, 250)
    assert view.now() == LoadNow(2, 0, 250), "its report said 0 queued: the 250 come on top"
    view.on_prefilled(covered)
    assert view.now() == LoadNow(2, 0, 0)
    view.on_finished(covered)
    view.on_finished(uncovered)
    assert view.own_requests == view.own_prefill_tokens == 0


def test_prompts_held_behind_a_prefix_come_from_a_fresh_report_only() -> None:
    """By the gateway's hash (the wire's 16 big-endian bytes); a stale report's are forgotten with it."""
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    held = PrefixWait(hash_to_bytes(7 << 100), 2_600, 2)
    reading = ReplicaLoad(ts=0.0, running=1, waiting=2, queued_prefill_tokens=3_000, prefix_waits=[held])
    view.on_report(decode_load(encode_load(reading)))
    assert view.now() == LoadNow(1, 2, 3_000, {7 << 100: (2_600, 2)})
    clock.now += 2.0
    assert view.now().prefix_waits == {}


def test_running_decodes_come_from_a_fresh_report_only_and_none_where_the_replica_gives_none() -> None:
    clock = Clock(100.0)
    view = LoadView(1.0, clock)
    decodes = [DecodeProgress(12, 0.33, 100), DecodeProgress(1, 0.0, 7)]
    view.on_report(decode_load(encode_load(ReplicaLoad(ts=0.0, running=2, waiting=0, decodes=decodes))))
    assert view.now().decodes == tuple(decodes)
    clock.now += 2.0
    assert view.now().decodes is None
    view.on_report(report(2, 0, None))
    assert view.now().decodes is None
