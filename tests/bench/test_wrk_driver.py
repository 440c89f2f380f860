"""The throughput bench's wrk driver against a real two-worker gateway in front of the nginx zero
backend: wrk's report is parsed into the numbers `kvgate bench throughput` prints, and the Lua
script's per-worker counts add up to the requests wrk made."""

import shutil
from pathlib import Path

import orjson
import pytest

from bench.harness.nginx_backend import nginx_backend, nginx_binary
from bench.harness.wrk import WORKER_HEADER, lua_script, run_wrk
from bench.micro.throughput import start_kvgate

pytestmark = pytest.mark.skipif(
    shutil.which("wrk") is None or nginx_binary() is None,
    reason="wrk or nginx not installed (`make test` installs both where apt-get can: `make bench-tools`)",
)


def test_wrk_counts_every_request_and_which_worker_served_it(tmp_path: Path) -> None:
    body = orjson.dumps({"model": "smollm2-135m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1})
    script = tmp_path / "chat.lua"
    script.write_text(lua_script([body]))
    with nginx_backend(tmp_path) as (backend_url, _):
        gateway = start_kvgate(backend_url, tmp_path, workers=2)
        try:
            step = run_wrk(gateway.url, script, connections=8, duration_s=1.0, threads=1)
        finally:
            gateway.stop()
    assert step.errors == 0
    assert step.requests > 0 and step.requests_per_s > 0
    assert 0 < step.p50_ms <= step.p99_ms
    assert set(step.served_by) <= {"0", "1"}, f"every answer carries {WORKER_HEADER}: {step.served_by}"
    assert sum(step.served_by.values()) == step.requests
