"""The engine's load reading says which of each sender's requests it counts (``protocol/load_mark.py``)."""

from engine.core.load_reading import LoadCounts, LoadReading
from protocol.load_mark import LOAD_MARK_TTL_S, MAX_ORIGINS, LoadMark, parse_load_mark
from tests.routing.helpers import Clock


def idle() -> tuple[int, int]:
    return 0, 0


def test_a_mark_is_acknowledged_with_the_request_it_came_with_and_only_moves_forward() -> None:
    reading = LoadReading(Clock(10.0))
    reading.arrived(300, LoadMark("g1", 2))
    assert reading.now(idle) == LoadCounts(0, 1, 300, {"g1": 2})
    reading.arrived(100, LoadMark("g1", 1))
    reading.arrived(50)
    assert reading.now(idle) == LoadCounts(0, 3, 450, {"g1": 2}), "an overtaken request leaves the latest"
    with reading.taking_in(300):
        pass
    assert reading.now(idle) == LoadCounts(0, 2, 450, {"g1": 2})


def test_a_request_that_ends_without_reaching_the_scheduler_is_acknowledged() -> None:
    reading = LoadReading(Clock(10.0))
    reading.ended(LoadMark("g1", 7))
    reading.ended(None)
    assert reading.now(idle) == LoadCounts(0, 0, 0, {"g1": 7})


def test_origins_not_heard_from_expire_and_their_number_is_bounded() -> None:
    clock = Clock(10.0)
    reading = LoadReading(clock)
    reading.ended(LoadMark("old", 1))
    clock.now += LOAD_MARK_TTL_S / 2
    reading.ended(LoadMark("new", 1))
    clock.now += LOAD_MARK_TTL_S / 2 + 1
    assert reading.now(idle).arrivals == {"new": 1}
    for index in range(MAX_ORIGINS + 10):
        reading.ended(LoadMark(f"o{index}", 1))
    reading.ended(LoadMark("o0", 2))
    arrivals = reading.now(idle).arrivals
    assert len(arrivals) == MAX_ORIGINS
    assert arrivals["o0"] == 2, "heard again: kept"
    assert "o1" not in arrivals and f"o{MAX_ORIGINS + 9}" in arrivals


def test_malformed_marks_are_no_marks() -> None:
    assert parse_load_mark("3f2a:12") == LoadMark("3f2a", 12)
    malformed = ("", "3f2a", ":12", "3f2a:", "3f2a:-1", "3f2a:1e3", "3f2a:\u0661", "x" * 33 + ":1", "a:" + "9" * 19)
    for value in (None, *malformed):
        assert parse_load_mark(value) is None, value
