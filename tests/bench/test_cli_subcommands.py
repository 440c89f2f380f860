"""``kvgate bench`` reaches every benchmark module; ``python -m bench.MODULE`` still works too."""

import subprocess
import sys

import pytest

from bench.cli import DELEGATED, SPAWNED
from bench.harness.processes import REPO
from gateway.process.cli import main as kvgate_main

MODULE_FLAGS = {
    "throughput": ("bench.micro.throughput", "--step-s"),
    "soak": ("bench.micro.soak", "--minutes"),
    "overhead-ab": ("bench.micro.overhead_ab", "--per-round"),
    "overhead": ("bench.micro.overhead", "--prompt-tokens"),
    "simulate": ("bench.sim.simulate_cli", "--max-num-seqs"),
}


@pytest.mark.parametrize("command", sorted(MODULE_FLAGS))
def test_kvgate_bench_hands_a_subcommand_its_flags(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        kvgate_main(["bench", command, "--help"])
    assert exit_.value.code == 0
    assert MODULE_FLAGS[command][1] in capsys.readouterr().out


def _modules_with_a_main() -> set[str]:
    """Every ``bench`` module runnable as a script, by its dotted name."""
    scripts = (path for path in (REPO / "bench").rglob("*.py") if 'if __name__ == "__main__":' in path.read_text())
    return {".".join(path.relative_to(REPO).with_suffix("").parts) for path in scripts}


def test_every_bench_module_with_a_main_is_a_subcommand() -> None:
    delegated = {module for module, _ in DELEGATED.values()}
    spawned = {script.removesuffix(".py").replace("/", ".") for script, _ in SPAWNED.values()}
    assert _modules_with_a_main() - delegated - spawned == set()


def test_the_bench_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        kvgate_main(["bench", "--help"])
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    for name, (_, summary) in {**DELEGATED, **SPAWNED}.items():
        assert f"{name} {summary}" in lines, name


@pytest.mark.parametrize("command", sorted(DELEGATED))
def test_each_delegated_subcommand_answers_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        kvgate_main(["bench", command, "--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(SPAWNED))
def test_each_spawned_subcommand_answers_help(command: str, capfd: pytest.CaptureFixture[str]) -> None:
    assert kvgate_main(["bench", command, "--help"]) == 0
    assert "usage:" in capfd.readouterr().out


@pytest.mark.parametrize("module", ["bench.micro.throughput", "bench.micro.soak", "bench.micro.overhead_ab"])
def test_python_dash_m_still_runs_each_module(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
