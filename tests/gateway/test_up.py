"""`kvgate up`: engines + gateway from one config, and no orphans when it stops or dies."""

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.procs import ManagedProcess, free_port, http, kvgate_cmd, start


def _child_pids(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def _start_up(
    tmp_path: Path, roles: tuple[str, str] = ("both", "both"), routing: dict | None = None
) -> tuple[ManagedProcess, list[int]]:
    port = free_port()
    engines = [
        {
            "name": f"sim-{i}",
            "port": free_port(),
            "kv_events_port": free_port(),
            "kv_events_replay_port": free_port(),
            "load_events_port": free_port(),
            "role": roles[i],
            "args": ["--sim", "--sim-preset", "instant", "--num-blocks", "256", "--max-model-len", "2048"],
        }
        for i in range(2)
    ]
    config_path = tmp_path / "config.yaml"
    config = {"listen": {"port": port}, "engines": engines, **({"routing": routing} if routing else {})}
    config_path.write_text(yaml.safe_dump(config))
    up = start(kvgate_cmd("up", "-c", str(config_path)), port, tmp_path / "up.log")
    return up, _child_pids(up.proc.pid)


def test_up_serves_then_stops_everything_on_sigterm(tmp_path: Path) -> None:
    up, engines = _start_up(tmp_path)
    try:
        assert len(engines) == 2
        reply = http(
            "POST",
            f"{up.url}/v1/chat/completions",
            {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        assert reply.status == 200 and reply.headers["x-kvgate-backend"] in {"sim-0", "sim-1"}
        assert sorted(http("GET", f"{up.url}/health").json()["healthy_backends"]) == ["sim-0", "sim-1"]
        stats = http("GET", f"{up.url}/dashboard/stats.json").json()
        assert isinstance(stats, dict)
        assert all(replica["load_reported"] for replica in stats["replicas"]), "load sockets not wired"
        kv_events = stats["prefix_index"]["index"]["kv_events"]
        assert all(kv_events[name]["replays"] >= 1 for name in ("sim-0", "sim-1")), "replay sockets not wired"
        os.kill(up.proc.pid, signal.SIGTERM)
        assert up.proc.wait(30) == 0
        assert _wait_gone(engines) == []
    finally:
        up.stop()


def test_up_starts_a_pd_fleet_whose_engines_carry_the_kv_connector(tmp_path: Path) -> None:
    """Roles on `engines:` are all it takes: each engine gets the connector, requests split."""
    up, _ = _start_up(tmp_path, ("prefill", "decode"), {"disaggregation": {"mode": "always"}})
    try:
        body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi " * 200}], "max_tokens": 3}
        reply = http("POST", f"{up.url}/v1/chat/completions", body)
        assert reply.status == 200, reply.body
        assert (reply.headers["x-kvgate-backend"], reply.headers["x-kvgate-prefill-backend"]) == ("sim-1", "sim-0")
        assert "pd=disaggregated" in reply.headers["x-kvgate-route-reason"]
    finally:
        up.stop()


def test_engines_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    up, engines = _start_up(tmp_path)
    try:
        up.kill()
        assert _wait_gone(engines) == []
    finally:
        for pid in engines:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_up_refuses_a_broken_config(tmp_path: Path) -> None:
    import subprocess

    config_path = tmp_path / "config.yaml"
    config_path.write_text("engines: [{port: 1, flags: []}]\n")
    result = subprocess.run(kvgate_cmd("up", "-c", str(config_path)), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "engines.0.flags: unknown key" in result.stderr


@pytest.mark.parametrize("command", ["up", "gateway", "engine", "plan", "bench"])
def test_every_command_explains_its_flags(command: str) -> None:
    import subprocess

    result = subprocess.run(kvgate_cmd(command, "--help"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout and "--" in result.stdout
