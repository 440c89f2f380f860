"""A compiled zero-latency backend for throughput runs: nginx answering every completion with a
fixed OpenAI-shaped JSON, so the backend costs the 2-core host a few microseconds per request
where the Python zero backend costs ~100.

The bench writes the config into a scratch directory (its own pid file, error log and temp
paths; nothing under /etc, /var or /run) and runs nginx in the foreground in its own process
group. What the gateway reads of a backend:
- ``GET /health``: 200 makes it healthy;
- ``GET /v1/models``: the model list (no ``max_model_len``, no adapters);
- ``GET /stats`` and ``GET /metrics``: 404, as from any engine that is neither the bundled one nor
  vLLM. The gateway then counts only its own in-flight requests as the replica's load, exactly as
  with the Python zero backend. (A static ``ReplicaStats`` would be worse: its fixed ``ts`` goes
  stale after a few health rounds, and a bundled engine's /stats also turns on retention hints.)
- ``POST /v1/chat/completions`` and ``/v1/completions``: one whole (non-streamed) completion
  with usage. nginx does not read the JSON body, so a streamed request gets the whole answer too:
  this backend is for the throughput bench, which sends whole chats only.
"""

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from bench.harness.processes import free_port, http_ok, launch, wait_ready

MODEL = "smollm2-135m"
ANSWER = "ok"


def _completion(chat: bool) -> bytes:
    choice: dict = {"index": 0, "finish_reason": "stop", "logprobs": None}
    choice |= {"message": {"role": "assistant", "content": ANSWER}} if chat else {"text": ANSWER}
    return orjson.dumps(
        {
            "id": "cmpl-zero",
            "object": "chat.completion" if chat else "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [choice],
            "usage": {
                "prompt_tokens": 0,
                "completion_tokens": 1,
                "total_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }
    )


RESPONSES: dict[str, bytes] = {
    "/v1/chat/completions": _completion(chat=True),
    "/v1/completions": _completion(chat=False),
}
"""POST path -> body."""
GETS: dict[str, bytes] = {
    "/health": orjson.dumps({"status": "ok"}),
    "/v1/models": orjson.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "bench"}]}
    ),
}
"""GET path -> body."""
NOT_FOUND = orjson.dumps({"error": {"message": "not found", "type": "not_found_error", "code": 404}})


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((path for path in ("/usr/sbin/nginx",) if Path(path).exists()), None)


def _quoted(body: bytes) -> str:
    """An nginx single-quoted string (the bodies are JSON: no quote or backslash to escape but these)."""
    return "'" + body.decode().replace("\\", "\\\\").replace("'", "\\'") + "'"


def nginx_config(workdir: Path, port: int) -> str:
    """The whole nginx.conf: one worker, no access log, keep-alive without a request cap, all paths in ``workdir``."""
    locations = [
        f"        location = {path} {{ if ($request_method != GET) {{ return 405; }} return 200 {_quoted(body)}; }}"
        for path, body in GETS.items()
    ]
    locations += [
        f"        location = {path} {{ if ($request_method != POST) {{ return 405; }} return 200 {_quoted(body)}; }}"
        for path, body in RESPONSES.items()
    ]
    temp_paths = "\n".join(
        f"    {kind}_temp_path {workdir / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""daemon off;
worker_processes 1;
pid {workdir / "nginx.pid"};
error_log {workdir / "nginx-error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    default_type application/json;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
{temp_paths}
    server {{
        listen 127.0.0.1:{port};
{chr(10).join(locations)}
        location / {{ return 404 {_quoted(NOT_FOUND)}; }}
    }}
}}
"""


@contextmanager
def nginx_backend(workdir: Path) -> Iterator[tuple[str, int]]:
    """nginx serving the zero backend on a free port: (its URL, the master's pid). Raises if nginx is absent."""
    binary = nginx_binary()
    if binary is None:
        raise FileNotFoundError("nginx not found (Debian: apt-get install -y nginx-light)")
    scratch = workdir / "nginx"
    scratch.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = scratch / "nginx.conf"
    config.write_text(nginx_config(scratch.resolve(), port))
    command = [
        binary,
        "-p",
        str(scratch.resolve()),
        "-e",
        str(scratch.resolve() / "nginx-error.log"),
        "-c",
        str(config.resolve()),
    ]
    server = launch(command, port, scratch / "nginx.out")
    try:
        wait_ready(server, lambda: http_ok(f"{server.url}/health"))
        yield server.url, server.proc.pid
    finally:
        server.stop()
