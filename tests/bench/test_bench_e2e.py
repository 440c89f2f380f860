"""Tiny end-to-end benches: 2 simulated replicas, kvgate against direct round robin, real processes."""

from pathlib import Path

import orjson

from bench.cli import main
from bench.harness.processes import free_port, http_ok, kvgate_command, launch, wait_ready

INSTANT_SIM = ("--sim", "--sim-preset", "instant", "--num-blocks", "128", "--max-model-len", "2048")
"""Given replicas that take no simulated time: the bench's hit rates, not its latencies, are checked."""


def test_tiny_shared_prefix_bench_reports_both_policies(tmp_path: Path) -> None:
    code = main(
        [
            "run",
            "--workload",
            "shared-prefix",
            "--replicas",
            "2",
            "--policy",
            "cache_aware,round_robin",
            "--num-blocks",
            "256",
            "--sim-prefill-us",
            "75",
            "--out",
            str(tmp_path),
            "--set",
            "num_groups=6",
            "--set",
            "prompts_per_group=4",
            "--set",
            "system_prompt_len=256",
            "--set",
            "question_len=32",
            "--set",
            "output_len=4",
            "--set",
            "request_rate=30",
        ]
    )
    assert code == 0
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    rows = {row["contender"]: row for row in report["rows"]}
    assert set(rows) == {"kvgate cache_aware", "kvgate round_robin", "direct round_robin"}
    for row in rows.values():
        assert 0.0 < row["hit_rate"] <= 1.0, "4 prompts per group on 2 replicas: every policy hits"
        assert row["errors"] == 0 and row["requests"] == 24
    bound = report["bounds"]["infinite_cache"]
    assert bound > 0.6, "18 of 24 prompts repeat a 256-token system prompt"
    cache_aware = rows["kvgate cache_aware"]["hit_rate"]
    assert 0.75 * bound <= cache_aware <= bound + 1e-9, "cache_aware sends a group's prompts to its first replica"
    assert cache_aware >= rows["kvgate round_robin"]["hit_rate"]
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.count("| kvgate") == 4, "the main table and the users' table"
    users = {row["contender"]: row for row in report["users"]}
    assert set(users) == set(rows) and all(row["shed_rate"] == row["error_rate"] == 0 for row in users.values())
    assert "(1.00x)" in markdown, "round robin against itself"
    assert (tmp_path / "hit_rate.png").stat().st_size > 0 and (tmp_path / "ttft_cdf.png").stat().st_size > 0


def test_given_replicas_are_reused_with_cold_caches(tmp_path: Path) -> None:
    replicas = [
        launch(
            kvgate_command("engine", "--port", str(port), *INSTANT_SIM),
            port,
            tmp_path / f"engine-{port}.log",
        )
        for port in (free_port(), free_port())
    ]
    try:
        for replica in replicas:
            wait_ready(replica, lambda url=replica.url: http_ok(f"{url}/health"))
        code = main(
            [
                "run",
                "--workload",
                "multi-turn",
                "--policy",
                "session",
                "--num-blocks",
                "128",
                "--predicted",
                "--replica-url",
                replicas[0].url,
                "--replica-url",
                replicas[1].url,
                "--out",
                str(tmp_path / "out"),
                "--set",
                "num_users=3",
                "--set",
                "turns=3",
                "--set",
                "system_prompt_len=64",
                "--set",
                "user_message_len=16",
                "--set",
                "answer_len=16",
                "--set",
                "output_len=2",
                "--set",
                "think_s=0",
            ]
        )
    finally:
        for replica in replicas:
            replica.stop()
    assert code == 0
    rows = {row["contender"]: row for row in orjson.loads((tmp_path / "out" / "report.json").read_bytes())["rows"]}
    assert rows["kvgate session"]["requests"] == rows["direct round_robin"]["requests"] == 9
    assert rows["kvgate session"]["hit_rate"] > rows["direct round_robin"]["hit_rate"] > 0.0
