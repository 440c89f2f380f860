"""The sim runner's step takes its modelled time end to end: the engine's own work between steps
counts against it instead of adding to it (checked on a fake clock, no timing)."""

from engine.model.runner_api import BlockTransfer, SamplingParams, SeqChunk
from engine.sim.sim_runner import SimCosts, SimRunner

PREFILL_S = 0.001
"""Modelled seconds per prefill token; nothing else costs time in these tests."""
COSTS = SimCosts(0.0, PREFILL_S, 0.0, 0.0, 0.0, 0.0, host_copy_per_token_s=0.0005)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def prefill(seq_id: int, tokens: int) -> SeqChunk:
    return SeqChunk(seq_id, list(range(tokens)), 0, [0], True, SamplingParams())


def runner_on(clock: FakeClock) -> SimRunner:
    return SimRunner(4, 16, COSTS, [7, 8, 9], clock=clock, sleep=clock.sleep)


def test_an_idle_engine_s_step_sleeps_the_whole_modelled_time() -> None:
    clock = FakeClock()
    runner = runner_on(clock)
    runner.execute([prefill(0, 10)])
    assert len(clock.slept) == 1 and abs(clock.slept[0] - 10 * PREFILL_S) < 1e-12


def test_engine_work_between_back_to_back_steps_is_part_of_the_next_step() -> None:
    clock = FakeClock()
    runner = runner_on(clock)
    runner.execute([prefill(0, 10)])
    first_end = clock.now
    clock.now += 0.004  # the engine schedules, streams tokens and publishes events
    runner.execute([prefill(0, 10)])
    assert abs(clock.slept[-1] - 0.006) < 1e-12
    assert abs(clock.now - first_end - 10 * PREFILL_S) < 1e-12, "wall time of the step = modelled, not + 4 ms"


def test_a_step_the_engine_outlasts_takes_the_engine_s_time_and_owes_nothing() -> None:
    clock = FakeClock()
    runner = runner_on(clock)
    runner.execute([prefill(0, 2)])
    clock.now += 0.005  # more than the 2 ms the next step is modelled to take
    runner.execute([prefill(0, 2)])
    assert clock.slept[-1] == 0.0, "no wait (only a yield) when the engine already spent the modelled time"
    clock.now += 0.001
    runner.execute([prefill(0, 2)])
    assert abs(clock.slept[-1] - 0.001) < 1e-12, "the overrun is not paid back by later steps"


def test_after_every_sequence_is_released_an_idle_gap_is_not_counted() -> None:
    clock = FakeClock()
    runner = runner_on(clock)
    runner.execute([prefill(0, 10)])
    runner.release(0)
    clock.now += 30.0  # no work: the engine waited for requests
    runner.execute([prefill(1, 10)])
    assert abs(clock.slept[-1] - 10 * PREFILL_S) < 1e-12


def test_host_copies_are_paid_with_the_next_step() -> None:
    clock = FakeClock()
    runner = runner_on(clock)
    runner.transfer([BlockTransfer(False, 0, 0), BlockTransfer(True, 1, 1)])
    assert clock.slept == []
    runner.execute([prefill(0, 10)])
    assert abs(clock.slept[-1] - (10 * PREFILL_S + 2 * 4 * 0.0005)) < 1e-12
    runner.execute([prefill(0, 10)])
    assert abs(clock.slept[-1] - 10 * PREFILL_S) < 1e-12, "a transfer is paid once"
