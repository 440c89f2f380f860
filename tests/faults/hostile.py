"""What the hostile-client tests share: raw HTTP over a socket, metric sums, request-log lines."""

import socket
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.procs import http


def raw_http(port: int, request: bytes, timeout: float = 20.0) -> tuple[int, bytes, bytes]:
    """Send bytes no HTTP library would send; the status, the head and the body (connection: close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


def raw_post(port: int, path: str, body: bytes, *header_lines: bytes) -> tuple[int, bytes, bytes]:
    head = b"".join(line + b"\r\n" for line in header_lines)
    return raw_http(
        port,
        f"POST {path} HTTP/1.1\r\nHost: kvgate\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + head
        + b"\r\n"
        + body,
    )


def metric_sums(url: str, admin_key: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    reply = http("GET", f"{url}/metrics", headers={"Authorization": f"Bearer {admin_key}"})
    assert reply.status == 200
    values: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            values[sample.name].append((sample.labels, sample.value))
    return values


def total(values: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(value for found, value in values[name] if all(found.get(k) == v for k, v in labels.items()))


def recorded_requests(url: str, admin_key: str) -> float:
    """Every request the gateway recorded: answered by a backend, or refused (or left) before."""
    values = metric_sums(url, admin_key)
    return total(values, "kvgate_requests_total") + total(values, "kvgate_rejections_total")


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Poll ``condition`` until it holds or the deadline passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.05)
    return True
