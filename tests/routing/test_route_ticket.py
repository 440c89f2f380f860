"""The route ticket: the caller holds what the router needs to settle a request (its prefix match
and prediction), so the router keeps nothing per request, and each ticket settles once."""

import gc
import weakref

from gateway.routing.config import RoutingConfig
from gateway.routing.router import ReplicaSpec, Router, RouteTicket
from tests.routing.helpers import BLOCK, MODEL, request, route_and_send, router, state, warm

IDLE = [state("a"), state("b"), state("c")]
BUSY_OWNER = [state("a"), state("b", in_flight=2, prefill_tokens=3000), state("c")]
"""b, which holds prefix 1, is busy but under the TTFT target: a private prefix waits for it, a
shared one (two recent requests with ``shared_prefix_requests=2``) moves to a."""


def test_a_ticket_sent_twice_counts_once() -> None:
    specs = [ReplicaSpec(name, MODEL, None, None) for name in "abc"]
    r = Router(RoutingConfig(shared_prefix_requests=2), BLOCK, specs, clock=lambda: 0.0)
    warm(r, "b", prefix=1)
    ticket = r.route(request(1, request_id="once"), IDLE)
    r.on_routed(ticket, "b")
    r.on_routed(ticket, "b")
    assert r.route(request(1, request_id="next"), BUSY_OWNER).decision.backend == "b", "one request counted"
    route_and_send(r, request(1, request_id="another"), IDLE)
    assert r.route(request(1, request_id="third"), BUSY_OWNER).decision.backend == "a", "two requests: shared"


def test_a_ticket_finished_twice_calibrates_once() -> None:
    r = router()
    warm(r, "a", prefix=1)
    ticket = r.route(request(1, request_id="x"), IDLE)
    r.on_routed(ticket, ticket.decision.backend)
    r.on_finished(ticket, 960, prefilled=True)
    r.on_finished(ticket, 960, prefilled=True)
    r.on_finished(ticket, None, prefilled=False)
    assert r.stats().calibration.count == 1
    assert r.tracker.index.match(ticket.request.block_hashes) == {"a": 64}, "a late failure undoes nothing"


def test_a_ticket_finished_without_being_sent_changes_nothing() -> None:
    r = router()
    warm(r, "a", prefix=1)
    ticket = r.route(request(1, prompt_tokens=2048, request_id="long"), IDLE)
    hashes = ticket.request.block_hashes
    r.on_finished(ticket, None, prefilled=False)
    r.on_finished(ticket, 960, prefilled=True)
    assert r.tracker.index.match(hashes) == {"a": 60}, "the holder's blocks stay"
    assert r.stats().calibration.count == 0
    r.on_routed(ticket, "a")
    assert r.tracker.index.match(hashes) == {"a": 128}
    r.on_finished(ticket, None, prefilled=False)
    assert r.tracker.index.match(hashes) == {"a": 60}, "sent, then failed: its own blocks are taken back"


def test_the_router_keeps_nothing_per_request() -> None:
    """Tickets routed and dropped (a client that left in the queue, a placement not taken), sent and
    never finished (a client that left mid-stream) or settled: none is held by the router after."""
    r = router()
    tickets: list[weakref.ref[RouteTicket]] = []
    for number in range(3000):
        ticket = r.route(request(number % 7, request_id=f"r{number}"), IDLE)
        tickets.append(weakref.ref(ticket))
        if number % 3:
            r.on_routed(ticket, ticket.decision.backend)
        if number % 3 == 2:
            r.on_finished(ticket, 0, prefilled=True)
        del ticket
    gc.collect()
    assert [ref for ref in tickets if ref() is not None] == []
    assert r.stats().calibration.count == 1000


def test_a_completed_answer_is_recorded_once_against_its_bound() -> None:
    r = router()
    ticket = r.route(request(1, request_id="answered"), IDLE)
    r.on_routed(ticket, ticket.decision.backend)
    r.on_finished(ticket, 0, True, completed_output_tokens=8)
    r.on_finished(ticket, 0, True, completed_output_tokens=8)
    unsent = r.route(request(1, request_id="never sent"), IDLE)
    r.on_finished(unsent, None, False, completed_output_tokens=8)
    cut = r.route(request(1, request_id="client gone"), IDLE)
    r.on_routed(cut, cut.decision.backend)
    r.on_finished(cut, 0, True)
    assert len(r.output_lengths) == 1
    for _ in range(40):
        r.output_lengths.record(8, 32)
    assert r.output_lengths.fraction_shorter(1, 32, 9) == 1.0, "8 of the request's 32: a quarter of its bound"
