"""The workload generators: shapes, reproducible seeds, and the trace mapping's prefix sharing."""

import random
from pathlib import Path

import orjson
import pytest

from bench.workloads import WORKLOADS, with_overrides
from bench.workloads.multi_turn import MultiTurnParams
from bench.workloads.multi_turn import generate as multi_turn
from bench.workloads.normalization_noise import NormalizationNoiseParams, add_noise
from bench.workloads.normalization_noise import generate as normalization_noise
from bench.workloads.shared_prefix import SharedPrefixParams
from bench.workloads.shared_prefix import generate as shared_prefix
from bench.workloads.skew import SkewParams
from bench.workloads.skew import generate as skew
from bench.workloads.token_blocks import FIRST_ORDINARY_TOKEN, SMOLLM2_VOCAB_SIZE
from bench.workloads.trace_replay import TraceReplayParams
from bench.workloads.trace_replay import generate as trace_replay
from bench.workloads.types import BenchRequest
from normalize.config import NormalizeConfig
from normalize.normalizer import Normalizer


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


def test_shared_prefix_shape() -> None:
    params = SharedPrefixParams(num_groups=4, prompts_per_group=3, system_prompt_len=64, question_len=8, output_len=5)
    requests = shared_prefix(params)
    assert len(requests) == 12
    assert all(len(request.prompt_ids) == 72 and request.max_tokens == 5 for request in requests)
    assert all(
        FIRST_ORDINARY_TOKEN <= token < SMOLLM2_VOCAB_SIZE for request in requests for token in request.prompt_ids
    )
    by_group: dict[str, list[tuple[int, ...]]] = {}
    for request in requests:
        by_group.setdefault(request.group, []).append(request.prompt_ids)
    assert len(by_group) == 4
    prefixes = {prompts[0][:64] for prompts in by_group.values()}
    assert len(prefixes) == 4
    for prompts in by_group.values():
        assert len({prompt[:64] for prompt in prompts}) == 1
        assert len({prompt[64:] for prompt in prompts}) == 3
    arrivals = [request.arrival_s for request in requests]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0


def test_generators_are_reproducible_and_seeded() -> None:
    for name, workload in WORKLOADS.items():
        if name == "trace-replay":
            continue
        params = workload.params_type()
        small = {"num_groups": 3, "prompts_per_group": 2, "num_requests": 6, "num_users": 2, "turns": 2}
        params = with_overrides(params, {key: str(value) for key, value in small.items() if hasattr(params, key)})
        first = workload.generate(params, range(100, 200))
        assert first == workload.generate(params, range(100, 200)), name
        assert first != workload.generate(with_overrides(params, {"seed": "1"}), range(100, 200)), name


def test_skew_sends_hot_fraction_to_one_group() -> None:
    requests = skew(SkewParams(num_groups=8, num_requests=2000, system_prompt_len=32, question_len=4))
    hot = sum(1 for request in requests if request.group == "group-0")
    assert 0.45 < hot / 2000 < 0.55
    assert len({request.prompt_ids[:32] for request in requests}) == 8


def test_multi_turn_resends_growing_history() -> None:
    params = MultiTurnParams(num_users=3, turns=4, system_prompt_len=32, user_message_len=8, answer_len=6)
    requests = multi_turn(params)
    assert len(requests) == 12
    for user in range(3):
        turns = [request for request in requests if request.session_id == f"user-{user}"]
        assert [len(turn.prompt_ids) for turn in turns] == [40, 54, 68, 82]
        for earlier, later in zip(turns, turns[1:], strict=False):
            assert later.prompt_ids[: len(earlier.prompt_ids)] == earlier.prompt_ids
            assert later.think_s == params.think_s
    assert len({request.prompt_ids[:32] for request in requests}) == 1


def test_multi_turn_think_jitter_varies_think_times_and_keeps_the_prompts() -> None:
    steady = MultiTurnParams(num_users=8, turns=6, system_prompt_len=32, user_message_len=8, answer_len=6)
    jittered = MultiTurnParams(**{**steady.__dict__, "think_jitter_s": 0.2})
    plain, varied = multi_turn(steady), multi_turn(jittered)
    assert [request.prompt_ids for request in varied] == [request.prompt_ids for request in plain]
    assert varied == multi_turn(jittered), "the same draws every time"
    thinks = [request.think_s for request in varied if not request.request_id.endswith("-0")]
    assert all(0.3 <= think <= 0.7 for think in thinks)
    assert len(set(thinks)) == len(thinks), "each turn draws its own think time"
    assert {request.think_s for request in varied if request.request_id.endswith("-0")} == {0.0}


def test_normalization_noise_keeps_meaning_and_canonical_form() -> None:
    params = NormalizationNoiseParams(num_groups=2, prompts_per_group=4, system_prompt_lines=6)
    requests = normalization_noise(params)
    assert len(requests) == 8
    for request in requests:
        sent, canonical = request.messages[0]["content"], request.canonical_messages[0]["content"]
        assert sent != canonical
        visible = sent.replace("\ufeff", "").replace("\u200b", "").replace("\r\n", "\n")
        assert "\n".join(line.rstrip() for line in visible.split("\n")).strip() == canonical
        assert request.messages[1] == request.canonical_messages[1]


def test_default_normalization_removes_all_noise() -> None:
    normalizer = Normalizer(NormalizeConfig())
    for request in normalization_noise(NormalizationNoiseParams(num_groups=4, prompts_per_group=25)):
        canonical = normalizer.apply({"model": "m", "messages": list(request.messages)}).body["messages"]
        assert canonical == list(request.canonical_messages)


def test_add_noise_changes_text() -> None:
    rng = random.Random(3)
    assert all(add_noise(rng, "a b\nc d\ne f") != "a b\nc d\ne f" for _ in range(50))


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    records = [
        {"timestamp": 0, "input_length": 1500, "output_length": 40, "hash_ids": [0, 1, 2]},
        {"timestamp": 500, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 7]},
        {"timestamp": 2000, "input_length": 600, "output_length": 900, "hash_ids": [0, 9]},
        {"timestamp": 3000, "input_length": 512, "output_length": 1, "hash_ids": [5]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(record) for record in records) + b"\n")
    return path


def test_trace_mapping_preserves_shared_prefixes_exactly(tiny_trace: Path) -> None:
    params = TraceReplayParams(trace_file=str(tiny_trace), block_tokens=64, time_compression=2.0, max_output_tokens=32)
    first, second, third, fourth = trace_replay(params)
    assert [len(r.prompt_ids) for r in (first, second, third, fourth)] == [188, 138, 75, 64]
    assert common_prefix(first.prompt_ids, second.prompt_ids) == 128
    assert common_prefix(first.prompt_ids, third.prompt_ids) == 64
    assert common_prefix(first.prompt_ids, fourth.prompt_ids) == 0
    assert [r.arrival_s for r in (first, second, third, fourth)] == [0.0, 0.25, 1.0, 1.5]
    assert [r.max_tokens for r in (first, second, third, fourth)] == [5, 1, 32, 1]
    again = trace_replay(TraceReplayParams(trace_file=str(tiny_trace), block_tokens=64))
    assert again[0].prompt_ids == first.prompt_ids


def test_arrival_jitter_spreads_each_request_within_its_step_seeded(tiny_trace: Path) -> None:
    def replay(seed: int, jitter_ms: float) -> list[BenchRequest]:
        return trace_replay(
            TraceReplayParams(
                trace_file=str(tiny_trace),
                block_tokens=64,
                time_compression=2.0,
                seed=seed,
                arrival_jitter_ms=jitter_ms,
            )
        )

    written = {r.request_id: r for r in replay(0, 0.0)}
    jittered = replay(0, 1000.0)
    assert [r.arrival_s for r in jittered] == sorted(r.arrival_s for r in jittered)
    for request in jittered:
        exact = written[request.request_id]
        assert request.prompt_ids == exact.prompt_ids and request.max_tokens == exact.max_tokens
        assert exact.arrival_s <= request.arrival_s < exact.arrival_s + 0.5, "within 1,000 trace ms / 2"
    assert [r.arrival_s for r in jittered] != [written[r.request_id].arrival_s for r in jittered]
    assert [r.arrival_s for r in replay(0, 1000.0)] == [r.arrival_s for r in jittered]
    assert [r.arrival_s for r in replay(1, 1000.0)] != [r.arrival_s for r in jittered]
    with pytest.raises(ValueError, match="arrival_jitter_ms"):
        replay(0, -1.0)


def test_trace_blocks_are_fixed_per_hash_id_across_requests(tiny_trace: Path) -> None:
    requests = trace_replay(TraceReplayParams(trace_file=str(tiny_trace), block_tokens=16))
    assert requests[0].prompt_ids[:16] == requests[2].prompt_ids[:16]
    assert requests[0].prompt_ids[16:32] != requests[2].prompt_ids[16:32]


TRACE_HEAD = Path(__file__).parent / "data" / "conversation_trace_head.jsonl"
"""The Mooncake conversation trace's first 200 records (data/README.md says where from)."""


def test_real_trace_prefix_sharing_matches_hash_ids() -> None:
    requests = trace_replay(TraceReplayParams(trace_file=str(TRACE_HEAD), max_requests=200, block_tokens=32))
    records = [orjson.loads(line) for line in TRACE_HEAD.read_bytes().splitlines()]
    for (a, ra), (b, rb) in zip(
        zip(requests, records, strict=False), list(zip(requests, records, strict=False))[1:], strict=False
    ):
        shared_ids = common_prefix(tuple(ra["hash_ids"]), tuple(rb["hash_ids"]))
        shared_tokens = min(shared_ids * 32, len(a.prompt_ids), len(b.prompt_ids))
        assert a.prompt_ids[:shared_tokens] == b.prompt_ids[:shared_tokens]


def test_with_overrides_converts_and_rejects_unknown() -> None:
    params = with_overrides(SharedPrefixParams(), {"num_groups": "3", "request_rate": "inf"})
    assert params.num_groups == 3 and params.request_rate == float("inf")
    with pytest.raises(ValueError, match="unknown parameters"):
        with_overrides(SharedPrefixParams(), {"groups": "3"})


def test_trace_windows_start_at_their_first_record_and_zero_takes_the_rest(tiny_trace: Path) -> None:
    whole = trace_replay(TraceReplayParams(trace_file=str(tiny_trace), block_tokens=64, time_compression=1.0))
    window = trace_replay(
        TraceReplayParams(trace_file=str(tiny_trace), start=1, max_requests=2, block_tokens=64, time_compression=1.0)
    )
    assert [r.prompt_ids for r in window] == [r.prompt_ids for r in whole[1:3]]
    assert [r.arrival_s for r in window] == [0.0, 1.5], "a window's clock starts at its first record"
    rest = trace_replay(TraceReplayParams(trace_file=str(tiny_trace), start=2, max_requests=0, block_tokens=64))
    assert [r.prompt_ids for r in rest] == [r.prompt_ids for r in whole[2:]]
