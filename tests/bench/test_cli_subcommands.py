"""``kvgate bench`` reaches every benchmark module; ``python -m bench.MODULE`` still works too."""

import subprocess
import sys

import pytest

from bench.processes import REPO
from gateway.cli import main as kvgate_main

MODULE_FLAGS = {
    "throughput": ("bench.throughput", "--step-s"),
    "soak": ("bench.soak", "--minutes"),
    "overhead-ab": ("bench.overhead_ab", "--per-round"),
    "overhead": ("bench.overhead", "--prompt-tokens"),
    "simulate": ("bench.simulate_cli", "--max-num-seqs"),
}


@pytest.mark.parametrize("command", sorted(MODULE_FLAGS))
def test_kvgate_bench_hands_a_subcommand_its_flags(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        kvgate_main(["bench", command, "--help"])
    assert exit_.value.code == 0
    assert MODULE_FLAGS[command][1] in capsys.readouterr().out


def test_the_bench_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        kvgate_main(["bench", "--help"])
    listed = capsys.readouterr().out
    assert all(command in listed for command in MODULE_FLAGS)


@pytest.mark.parametrize("module", ["bench.throughput", "bench.soak", "bench.overhead_ab"])
def test_python_dash_m_still_runs_each_module(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
