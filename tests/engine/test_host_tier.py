"""The host KV tier: blocks move device -> host -> device with the right contents, events and no leaks.

``TokenKVRunner`` stands in for the model's KV: every device block and host slot records which
token each of its offsets holds, copies move those records, and every step checks that the
cached positions a chunk attends to hold exactly the sequence's tokens. So a copy run out of
order, a slot reused too early or a hit on the wrong block fails the step, without torch.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.core.session_retention import SessionRetention
from engine.model.runner_api import BlockTransfer, SeqChunk
from radix.hashing import block_hashes, hash_to_bytes
from radix.kv_event_format import MEDIUM_CPU, MEDIUM_GPU, BlockRemoved, BlockStored
from tests.engine.sequences import make_seq

BLOCK = 4
MODEL = "test-model"


class TokenKVRunner:
    """A runner whose "KV" of a position is the token at that position."""

    def __init__(self, num_blocks: int, host_slots: int) -> None:
        self.block_size = BLOCK
        self.num_blocks = num_blocks
        self.device: list[list[int | None]] = [[None] * BLOCK for _ in range(num_blocks)]
        self.host: list[list[int | None]] = [[None] * BLOCK for _ in range(host_slots)]
        self.tokens: dict[int, list[int]] = {}
        self.copies = {True: 0, False: 0}

    def transfer(self, transfers: list[BlockTransfer]) -> None:
        for transfer in transfers:
            if transfer.to_host:
                self.host[transfer.host_slot] = list(self.device[transfer.device_block])
            else:
                self.device[transfer.device_block] = list(self.host[transfer.host_slot])
            self.copies[transfer.to_host] += 1

    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        for chunk in chunks:
            known = self.tokens[chunk.seq_id]
            for pos in range(chunk.start_pos):
                held = self.device[chunk.block_table[pos // BLOCK]][pos % BLOCK]
                assert held == known[pos], f"seq {chunk.seq_id} pos {pos}: cache holds {held}, expected {known[pos]}"
            for offset, token in enumerate(chunk.token_ids):
                pos = chunk.start_pos + offset
                self.device[chunk.block_table[pos // BLOCK]][pos % BLOCK] = token
        return [1000 + chunk.start_pos + len(chunk.token_ids) if chunk.sample else None for chunk in chunks]

    def release(self, seq_id: int) -> None:
        self.tokens.pop(seq_id, None)


def compute_all(manager: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = len(seq.token_ids)
    manager.register_computed_blocks(seq)


def test_evicted_blocks_go_to_host_and_come_back_as_hits() -> None:
    manager = BlockManager(4, BLOCK, MODEL, host_blocks=8)
    first = make_seq(0, list(range(13)))
    assert manager.allocate(first)
    compute_all(manager, first)
    manager.free(first)
    manager.drain_events()
    other = make_seq(1, list(range(100, 116)))
    assert manager.allocate(other)
    out = manager.take_transfers()
    assert [t.to_host for t in out] == [True, True, True]
    assert len(manager.host) == 3 and manager.num_cached_blocks == 0
    hashes = block_hashes(list(range(12)), BLOCK, MODEL)
    events = manager.drain_events()
    assert BlockRemoved([hash_to_bytes(hashes[2])], MEDIUM_GPU) in events
    assert (
        BlockStored([hash_to_bytes(hashes[2])], hash_to_bytes(hashes[1]), list(range(8, 12)), BLOCK, medium=MEDIUM_CPU)
        in events
    )
    manager.assert_invariants()
    compute_all(manager, other)
    manager.free(other)

    again = make_seq(2, list(range(13)))
    assert manager.allocate(again)
    assert again.num_computed_tokens == 12 and again.num_host_hit_tokens == 12
    back = [t for t in manager.take_transfers() if not t.to_host]
    assert sorted(t.host_slot for t in back) == sorted(t.host_slot for t in out)
    assert [t.device_block for t in back] == again.block_table[:3]
    events = manager.drain_events()
    assert BlockRemoved([hash_to_bytes(h) for h in hashes], MEDIUM_CPU) in events
    assert BlockStored([hash_to_bytes(h) for h in hashes], None, list(range(12)), BLOCK) in events
    assert manager.num_host_hit_blocks == 3 and len(manager.host) == 4  # other's 4 blocks went to host
    manager.assert_invariants()


def test_host_pool_is_lru_bounded_and_reports_what_it_drops() -> None:
    manager = BlockManager(2, BLOCK, MODEL, host_blocks=2)
    for seq_id in range(4):
        seq = make_seq(seq_id, [seq_id * 10 + offset for offset in range(5)])
        assert manager.allocate(seq)
        compute_all(manager, seq)
        manager.free(seq)
        manager.take_transfers()
        manager.assert_invariants()
    assert len(manager.host) == 2
    dropped = [e for e in manager.drain_events() if isinstance(e, BlockRemoved) and e.medium == MEDIUM_CPU]
    assert dropped == [BlockRemoved([hash_to_bytes(block_hashes([0, 1, 2, 3], BLOCK, MODEL)[0])], MEDIUM_CPU)]


def test_a_block_recomputed_on_device_leaves_the_host_pool() -> None:
    """With its first block gone, a prompt recomputes its second although the host holds it: the
    fresh device copy is the one cached, and the host copy is dropped (a block lives in one tier)."""
    manager = BlockManager(3, BLOCK, MODEL, host_blocks=4)
    first = make_seq(0, list(range(9)))
    manager.allocate(first)
    compute_all(manager, first)
    manager.free(first)
    filler = make_seq(1, list(range(50, 61)))
    manager.allocate(filler)
    manager.take_transfers()
    manager.free(filler)
    first_hash, second_hash = block_hashes(list(range(8)), BLOCK, MODEL)
    assert manager.host.discard(first_hash)
    manager.drain_events()
    again = make_seq(2, list(range(9)))
    assert manager.allocate(again) and again.num_computed_tokens == 0
    compute_all(manager, again)
    manager.take_transfers()
    assert second_hash in manager._cached and second_hash not in manager.host.hashes()
    assert BlockRemoved([hash_to_bytes(second_hash)], MEDIUM_CPU) in manager.drain_events()
    manager.assert_invariants()


def run_workload(
    prompts: list[list[int]],
    num_blocks: int,
    host_slots: int,
    max_num_seqs: int = 3,
    budget: int = 6,
    sessions: list[str | None] | None = None,
    aborted: frozenset[int] = frozenset(),
) -> tuple[BlockManager, TokenKVRunner, list[Sequence]]:
    """Run the prompts to completion; ``aborted`` requests are cut after their first step (a
    client gone), as ``LLMEngine._abort`` does."""
    retention = SessionRetention(num_blocks // 2, ttl_s=600) if sessions else None
    manager = BlockManager(num_blocks, BLOCK, MODEL, host_blocks=host_slots, retention=retention)
    scheduler = Scheduler(manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    runner = TokenKVRunner(num_blocks, host_slots)
    seqs = []
    for seq_id, prompt in enumerate(prompts):
        seq = make_seq(seq_id, prompt, max_tokens=3, session=sessions[seq_id] if sessions else None)
        runner.tokens[seq_id] = seq.token_ids
        scheduler.add(seq)
        seqs.append(seq)
    for _ in range(2_000):
        if not scheduler.has_work:
            break
        step = scheduler.schedule()
        runner.transfer(step.transfers)
        sampled = runner.execute(step.chunks)
        scheduler.postprocess(step, sampled)
        for seq in step.seqs:
            if (seq.finish_reason is not None or seq.seq_id in aborted) and not seq.is_finished:
                scheduler.finish(seq)
        manager.assert_invariants()
    assert not scheduler.has_work
    return manager, runner, seqs


def test_one_at_a_time_replays_hit_the_host_with_the_right_kv() -> None:
    """Three 16-token documents cycle through an 8-block device pool: each evicts the last, whose
    blocks wait on the host until it comes round again."""
    documents = [list(range(family * 100, family * 100 + 16)) for family in range(3)]
    prompts = [document + [7] for document in documents] * 3
    manager, runner, seqs = run_workload(prompts, num_blocks=8, host_slots=16, max_num_seqs=1)
    assert manager.num_host_hit_blocks > 0 and runner.copies[False] == manager.num_host_hit_blocks
    assert all(seq.num_cached_tokens == 16 and seq.num_host_cached_tokens == 16 for seq in seqs[3:])
    assert manager.num_free_blocks == manager.num_blocks


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(1, 24)), min_size=1, max_size=14),
    st.integers(9, 16),
    st.integers(0, 12),
    st.booleans(),
    st.frozensets(st.integers(0, 13), max_size=4),
)
def test_random_workloads_keep_kv_right_and_leak_nothing(
    shapes: list[tuple[int, int]], num_blocks: int, host_slots: int, with_sessions: bool, aborted: frozenset[int]
) -> None:
    """Concurrent requests, preemptions (pools just over one sequence), aborts, hits on device
    and host, sessions retained or not: every attended position holds its token, and afterwards
    every block and host slot is accounted for."""
    prompts = [[family] * 6 + list(range(family * 100, family * 100 + length)) for family, length in shapes]
    sessions: list[str | None] = [f"s{family}" if family % 2 else None for family, _ in shapes]
    manager, runner, _ = run_workload(
        prompts, num_blocks, host_slots, sessions=sessions if with_sessions else None, aborted=aborted
    )
    assert manager.num_free_blocks == manager.num_blocks
    assert len(manager.host) <= host_slots
    manager.assert_invariants()
