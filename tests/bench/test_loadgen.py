"""The load generator against the zero-latency backend (a real process on loopback)."""

import asyncio
import math
from collections.abc import Iterator

import pytest

from bench.harness.loadgen import Target, request_body, run_load
from bench.harness.processes import free_port, http_ok, launch, module_command, wait_ready
from bench.harness.report import summarize
from bench.workloads.types import BenchRequest


@pytest.fixture(scope="module")
def zero_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    process = launch(
        module_command("bench.harness.zero_backend", "--port", str(port)),
        port,
        tmp_path_factory.mktemp("zero") / "zero.log",
    )
    wait_ready(process, lambda: http_ok(f"{process.url}/health"))
    yield process.url
    process.stop()


def completion(index: int, session: str, arrival_s: float, think_s: float = 0.0) -> BenchRequest:
    return BenchRequest(f"r{index}", session, arrival_s, max_tokens=4, prompt_ids=(20, 21, 22, index), think_s=think_s)


def test_open_loop_times_every_request_and_reads_usage(zero_backend: str) -> None:
    requests = [completion(index, f"s{index}", arrival_s=index * 0.05) for index in range(6)]
    chat = BenchRequest("chat", "chat", 0.0, max_tokens=2, messages=({"role": "user", "content": "hi"},))
    load = asyncio.run(run_load([*requests, chat], Target((zero_backend,), "smollm2-135m")))
    assert len(load.results) == 7 and all(result.ok for result in load.results)
    by_id = {result.request_id: result for result in load.results}
    assert by_id["r3"].prompt_tokens == 4 and by_id["r3"].output_tokens == 1
    assert by_id["r5"].start_s >= 0.25
    assert all(0 < result.ttft_s <= result.e2e_s for result in load.results)
    row = summarize("zero", load, [7], ttft_slo_s=1.0)
    assert row.errors == 0 and row.requests == 7 and row.hit_rate == 0.0 and row.load_max_over_mean == 1.0
    assert math.isnan(row.tpot_p50_s)


def test_session_turns_wait_for_the_previous_turn(zero_backend: str) -> None:
    turns = [completion(index, "user", arrival_s=0.0, think_s=0.1 if index else 0.0) for index in range(3)]
    load = asyncio.run(run_load(turns, Target((zero_backend,), "smollm2-135m"), users=1))
    starts = [result.start_s for result in load.results]
    assert starts[1] - starts[0] >= 0.1 and starts[2] - starts[1] >= 0.1


def test_unreachable_target_is_an_error_not_a_crash() -> None:
    load = asyncio.run(run_load([completion(0, "s", 0.0)], Target((f"http://127.0.0.1:{free_port()}",), "m")))
    assert not load.results[0].ok and load.results[0].error


def test_text_targets_get_detokenized_prompts() -> None:
    request = completion(0, "s", 0.0)
    path, body = request_body(request, Target(("http://x",), "m", detokenize=lambda ids: " ".join(map(str, ids))))
    assert path == "/v1/completions" and body["prompt"] == "20 21 22 0"
    assert body["stream_options"] == {"include_usage": True}
    assert request_body(request, Target(("http://x",), "m"))[1]["prompt"] == [20, 21, 22, 0]
