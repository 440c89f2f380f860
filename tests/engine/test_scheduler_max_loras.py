"""Scheduler with ``max_loras`` (vLLM's ``--max-loras``): no step holds more distinct adapters,
base-model requests are not held up by it, and a request for another adapter is not starved."""

from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.model.lora_modules import LoRARef
from tests.engine.scheduler_steps import BLOCK, run_step
from tests.engine.sequences import make_seq

ADAPTERS = {lora_id: LoRARef(f"adapter-{lora_id}", lora_id) for lora_id in (1, 2, 3)}


def make_scheduler(max_loras: int | None, max_num_seqs: int = 16) -> Scheduler:
    return Scheduler(BlockManager(256, BLOCK, "test-model"), max_num_seqs, 256, max_loras=max_loras)


def lora_seq(seq_id: int, lora_id: int) -> Sequence:
    """A six-token sequence under adapter ``lora_id`` (0: the base model)."""
    return make_seq(seq_id, 6, max_total_tokens=64, adapter=ADAPTERS.get(lora_id))


def adapters_per_step(scheduler: Scheduler, max_steps: int = 200) -> list[set[int]]:
    """Run until idle; the distinct adapters (not the base model) of each step."""
    steps: list[set[int]] = []
    while scheduler.has_work:
        steps.append({chunk.lora_id for chunk in run_step(scheduler) if chunk.lora_id})
        assert len(steps) < max_steps, "scheduler made no progress"
    return steps


def test_no_step_holds_more_than_max_loras_adapters() -> None:
    scheduler = make_scheduler(max_loras=2)
    seqs = [lora_seq(seq_id, lora_id) for seq_id, lora_id in enumerate([1, 2, 3, 1, 3, 2, 0, 3])]
    for seq in seqs:
        scheduler.add(seq)
    steps = adapters_per_step(scheduler)
    assert max(map(len, steps)) == 2
    assert set().union(*steps) == {1, 2, 3}
    assert all(seq.finish_reason == "length" for seq in seqs)


def test_without_a_limit_every_adapter_shares_the_first_step() -> None:
    scheduler = make_scheduler(max_loras=None)
    for seq_id, lora_id in enumerate([1, 2, 3]):
        scheduler.add(lora_seq(seq_id, lora_id))
    assert {chunk.lora_id for chunk in run_step(scheduler)} == {1, 2, 3}


def test_base_model_requests_pass_a_request_waiting_for_an_adapter_slot() -> None:
    scheduler = make_scheduler(max_loras=1)
    for seq_id, lora_id in enumerate([1, 2, 0, 1]):
        scheduler.add(lora_seq(seq_id, lora_id))
    first = run_step(scheduler)
    assert [(chunk.seq_id, chunk.lora_id) for chunk in first] == [(0, 1), (2, 0)]
    assert [seq.seq_id for seq in scheduler.waiting] == [1, 3], "adapter 1's later request queues behind adapter 2"


def test_a_request_for_another_adapter_is_not_starved_by_a_steady_stream() -> None:
    """Adapter 1's requests keep arriving, one per step, each running a few steps: adapter 2's
    request, queued behind the first, still starts once the running adapter-1 requests drain."""
    scheduler = make_scheduler(max_loras=1)
    scheduler.add(lora_seq(0, 1))
    run_step(scheduler)
    waiting = lora_seq(1, 2)
    scheduler.add(waiting)
    for seq_id in range(2, 40):
        scheduler.add(lora_seq(seq_id, 1))
        if any(chunk.seq_id == waiting.seq_id for chunk in run_step(scheduler)):
            break
    else:
        raise AssertionError("the adapter-2 request never started")
    assert seq_id < 10, f"it waited {seq_id} steps"
    assert {seq.lora_id for seq in scheduler.running} == {2}
    assert max(map(len, adapters_per_step(scheduler))) == 1
