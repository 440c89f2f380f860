"""Scheduler: chunked prefill under a token budget, decodes interleaved, preemption, abort."""

from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.model.runner_api import SamplingParams
from tests.engine.scheduler_steps import BLOCK, run_step
from tests.engine.sequences import make_seq


def make_scheduler(num_blocks: int, max_num_seqs: int = 8, budget: int = 64) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BLOCK, "test-model"), max_num_seqs, budget)


def run_to_completion(scheduler: Scheduler, max_steps: int = 500) -> int:
    steps = 0
    while scheduler.has_work:
        run_step(scheduler)
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    return steps


def test_long_prompt_is_prefilled_in_chunks_within_the_budget() -> None:
    scheduler = make_scheduler(num_blocks=32, budget=8)
    seq = make_seq(0, 20)
    scheduler.add(seq)
    chunks = [run_step(scheduler)[0] for _ in range(3)]
    assert [(len(c.token_ids), c.start_pos, c.sample) for c in chunks] == [(8, 0, False), (8, 8, False), (4, 16, True)]
    assert chunks[1].block_table == seq.block_table[:4]
    assert seq.num_output_tokens == 1


def test_decodes_run_alongside_a_chunked_prefill() -> None:
    scheduler = make_scheduler(num_blocks=32, budget=8)
    decoding = make_seq(0, 3, max_tokens=10)
    scheduler.add(decoding)
    run_step(scheduler)
    scheduler.add(make_seq(1, 30))
    chunks = run_step(scheduler)
    assert [(c.seq_id, len(c.token_ids)) for c in chunks] == [(0, 1), (1, 7)]
    chunks = run_step(scheduler)
    assert [(c.seq_id, len(c.token_ids)) for c in chunks] == [(0, 1), (1, 7)]


def test_a_sequence_with_pulled_kv_starts_ahead_of_running_and_queued_prefills() -> None:
    """A P/D decode leg lacks only its prompt's tail: it goes before the running prefill's chunk
    and before prompts queued ahead of it, instead of waiting out every chunk of theirs."""
    scheduler = make_scheduler(num_blocks=64, budget=8)
    manager = scheduler.block_manager
    long_prompt, queued, pulled = make_seq(0, 40), make_seq(1, 12), make_seq(2, 13)
    scheduler.add(long_prompt)
    run_step(scheduler)
    scheduler.add(queued)
    manager.want_prefix(pulled)
    taken = manager.install_remote(pulled, 0, 3)
    manager.release_wants(pulled)
    pulled.num_transferred_tokens = len(taken) * BLOCK
    scheduler.add(pulled)
    manager.unpin([block_id for _, block_id in taken])
    chunks = run_step(scheduler)
    assert [(c.seq_id, c.start_pos, len(c.token_ids)) for c in chunks] == [(2, 12, 1), (0, 8, 7)]
    assert pulled.num_output_tokens == 1 and pulled.num_cached_tokens == 12
    assert list(scheduler.waiting) == [queued]
    run_to_completion(scheduler)
    assert long_prompt.num_output_tokens == queued.num_output_tokens == 4


def test_sequence_cap_limits_the_running_batch() -> None:
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=2)
    for seq_id in range(4):
        scheduler.add(make_seq(seq_id, 5))
    chunks = run_step(scheduler)
    assert [c.seq_id for c in chunks] == [0, 1]
    assert len(scheduler.waiting) == 2


def test_out_of_blocks_preempts_the_newest_and_everything_completes() -> None:
    scheduler = make_scheduler(num_blocks=6)
    seqs = [make_seq(seq_id, 7, max_tokens=9) for seq_id in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    run_to_completion(scheduler)
    assert scheduler.num_preemptions > 0
    assert all(seq.num_output_tokens == 9 and seq.finish_reason == "length" for seq in seqs)
    assert scheduler.block_manager.num_free_blocks == 6


def test_preempted_sequence_resumes_with_its_output_and_hits_its_own_blocks() -> None:
    scheduler = make_scheduler(num_blocks=6)
    old, new = make_seq(0, 8, max_tokens=12), make_seq(1, 8, max_tokens=12)
    scheduler.add(old)
    scheduler.add(new)
    while new.status is not SequenceStatus.WAITING or new.num_output_tokens == 0:
        run_step(scheduler)
    assert scheduler.waiting[0] is new and new.block_table == []
    generated = new.output_token_ids
    resumed = []
    while not resumed:
        resumed = [chunk for chunk in run_step(scheduler) if chunk.seq_id == new.seq_id]
    assert resumed[0].start_pos >= BLOCK, "the recompute starts after the blocks still cached"
    assert resumed[0].token_ids == (new.prompt_token_ids + generated)[resumed[0].start_pos :]
    run_to_completion(scheduler)
    assert new.output_token_ids[: len(generated)] == generated
    assert new.num_cached_tokens == 0, "cached_tokens reports the first admission only"


def test_abort_frees_running_and_waiting_sequences() -> None:
    scheduler = make_scheduler(num_blocks=8, max_num_seqs=1)
    running, waiting = make_seq(0, 9, max_tokens=50), make_seq(1, 9)
    scheduler.add(running)
    scheduler.add(waiting)
    run_step(scheduler)
    scheduler.finish(running)
    scheduler.finish(waiting)
    assert not scheduler.has_work
    assert scheduler.block_manager.num_free_blocks == 8
    assert running.status is SequenceStatus.FINISHED
    scheduler.assert_invariants()


def test_eos_finishes_a_sequence_unless_ignored() -> None:
    seq = make_seq(0, 3, max_tokens=5)
    seq.eos_token_id = 7
    seq.append_token(7)
    assert seq.finish_reason == "stop"
    ignoring = make_seq(1, 3, max_tokens=5)
    ignoring.sampling.ignore_eos = True
    ignoring.eos_token_id = 7
    ignoring.append_token(7)
    assert ignoring.finish_reason is None


def test_queued_prefill_counts_running_remainders_and_whole_waiting_prompts() -> None:
    """The load every gateway routes on; a waiting prompt counts whole, its cached prefix too (see
    ``Scheduler.queued_prefill_tokens``)."""
    scheduler = make_scheduler(num_blocks=64, budget=8)
    first_turn = make_seq(0, 40, max_tokens=1)
    scheduler.add(first_turn)
    run_to_completion(scheduler)
    scheduler.add(make_seq(1, 30))
    run_step(scheduler)
    follow_up = Sequence(
        2, [*first_turn.prompt_token_ids, 7, 8, 9, 10, 11, 12], SamplingParams(max_tokens=2), max_total_tokens=256
    )
    scheduler.add(follow_up)
    scheduler.add(make_seq(3, 10))
    assert scheduler.queued_prefill_tokens() == (30 - 8) + 46 + 10
    while follow_up.status is SequenceStatus.WAITING:
        run_step(scheduler)
    assert follow_up.num_cached_tokens == 40


def test_a_queued_follow_up_keeps_its_cached_prefix_while_others_are_admitted_first() -> None:
    """The one-shot queued ahead needs cache space: it must evict the other cached prompt, not
    the prefix the follow-up was routed here for."""
    scheduler = make_scheduler(num_blocks=8)
    older, newer = make_seq(0, 12, max_tokens=1), make_seq(1, 12, max_tokens=1)
    for seq in (older, newer):
        scheduler.add(seq)
        run_to_completion(scheduler)
    scheduler.add(make_seq(2, 20, max_tokens=1))
    follow_up = Sequence(3, [*older.prompt_token_ids, 7, 8], SamplingParams(max_tokens=1), max_total_tokens=256)
    scheduler.add(follow_up)
    run_to_completion(scheduler)
    assert follow_up.num_cached_tokens == 12


def follow_up_of(first: Sequence, seq_id: int, extra: int = 4) -> Sequence:
    prompt = [*first.prompt_token_ids, *range(40, 40 + extra)]
    return Sequence(seq_id, prompt, SamplingParams(temperature=0.0, max_tokens=4), max_total_tokens=256)


def follow_up_during_prefill(budget: int) -> tuple[Scheduler, Sequence, Sequence]:
    """A 32-token first turn one step into its prefill, and its follow-up just queued."""
    scheduler = make_scheduler(num_blocks=32, budget=budget)
    first = make_seq(0, 32)
    scheduler.add(first)
    run_step(scheduler)
    follow_up = follow_up_of(first, 1)
    scheduler.add(follow_up)
    return scheduler, first, follow_up


def test_a_follow_up_waits_for_the_prefix_its_first_turn_is_computing() -> None:
    """Admitted at once, the follow-up would compute the same 32 tokens a second time."""
    scheduler, first, follow_up = follow_up_during_prefill(budget=8)
    while first.num_computed_tokens < 32:
        assert [chunk.seq_id for chunk in run_step(scheduler)] == [0], "the follow-up waits"
    run_to_completion(scheduler)
    assert follow_up.num_cached_tokens == 32


def test_a_follow_up_whose_first_turn_is_aborted_stops_waiting() -> None:
    scheduler, first, follow_up = follow_up_during_prefill(budget=8)
    scheduler.finish(first)
    assert [chunk.seq_id for chunk in run_step(scheduler)] == [1]
    assert follow_up.num_cached_tokens == 8, "the chunk the first turn computed before it left"


def test_requests_behind_a_waiting_follow_up_still_start() -> None:
    scheduler, _, _ = follow_up_during_prefill(budget=20)
    scheduler.add(make_seq(2, 4))
    assert [chunk.seq_id for chunk in run_step(scheduler)] == [0, 2]


def test_an_aborted_queued_request_releases_the_prefix_it_wanted() -> None:
    scheduler = make_scheduler(num_blocks=16, max_num_seqs=1)
    first = make_seq(0, 16, max_tokens=1)
    scheduler.add(first)
    run_to_completion(scheduler)
    blocker = make_seq(1, 4, max_tokens=8)
    scheduler.add(blocker)
    run_step(scheduler)
    queued = follow_up_of(first, 2)
    scheduler.add(queued)
    assert queued.wanted_hashes, "it wants the first turn's cached blocks"
    scheduler.finish(queued)
    assert not queued.wanted_hashes
    scheduler.assert_invariants()
    run_to_completion(scheduler)


def test_prompts_held_behind_a_prefix_being_computed_are_reported_by_the_awaited_block() -> None:
    """What the load report's ``prefix_waits`` says: the follow-ups waiting for their first turn's
    prefix, grouped by the block they wait for; a prompt that waits for nothing is not among them."""
    scheduler, first, _ = follow_up_during_prefill(budget=8)
    scheduler.add(follow_up_of(first, 2, extra=6))
    scheduler.max_num_seqs = 1
    scheduler.add(make_seq(3, 12))
    awaited = first.block_hashes[first.num_computed_tokens // BLOCK]
    assert scheduler.prefix_waits() == {awaited: (36 + 38, 2)}
    run_step(scheduler)
    assert scheduler.prefix_waits() == {first.block_hashes[first.num_computed_tokens // BLOCK]: (36 + 38, 2)}, (
        "the next block the first turn computes"
    )
    run_to_completion(scheduler)
    assert scheduler.prefix_waits() == {}
