"""Ports for child processes come from below the kernel's ephemeral range, where no outgoing
connection can take them before the child binds them, and never twice."""

import socket

import pytest

from bench.harness import processes
from bench.harness.processes import free_port


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    floor = int(processes.EPHEMERAL_PORTS.read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(processes.LOWEST_PORT <= port < floor for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        draws = [port, port]
        real_randrange = processes.random.randrange

        def taken_port_first(low: int, high: int) -> int:
            """The taken port twice, then real draws: any fixed second port could be busy too."""
            return draws.pop() if draws else real_randrange(low, high)

        monkeypatch.setattr(processes, "LOWEST_PORT", 1024)
        monkeypatch.setattr(processes, "_ephemeral_floor", lambda: 65536)
        monkeypatch.setattr(processes.random, "randrange", taken_port_first)
        assert free_port() != port
        assert not draws


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "_ephemeral_floor", lambda: processes.LOWEST_PORT)
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_side_by_side_workers_draw_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[set[int]] = []
    for index in range(3):
        monkeypatch.setattr(processes, "PORT_SHARE", (index, 3))
        drawn.append({free_port() for _ in range(50)})
    assert not drawn[0] & drawn[1] and not drawn[1] & drawn[2] and not drawn[0] & drawn[2]
    assert max(drawn[0]) < min(drawn[1]) and max(drawn[1]) < min(drawn[2])
