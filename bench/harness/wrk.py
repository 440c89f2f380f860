"""wrk, the compiled HTTP load generator, driven from Python: a Lua script that POSTs chat bodies
in turn and counts which gateway worker answered each (the ``x-kvgate-worker`` header), one run
at a given number of connections, and its report parsed.
"""

import re
import resource
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

WORKER_HEADER = "x-kvgate-worker"
LUA_TEMPLATE = """
local bodies = {{{bodies}}}
local index = 0
local threads = {{}}
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  served = {{}}
end
function request()
  index = index % #bodies + 1
  return wrk.format(nil, "/v1/chat/completions", nil, bodies[index])
end
function response(status, headers, body)
  local worker = headers["{header}"] or "-"
  served[worker] = (served[worker] or 0) + 1
end
function done(summary, latency, requests)
  for _, thread in ipairs(threads) do
    for worker, count in pairs(thread:get("served")) do
      io.write(string.format("served-by %s %d\\n", worker, count))
    end
  end
end
"""


@dataclass(frozen=True)
class Step:
    connections: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int = 0
    duration_s: float = 0.0
    wrk_cpu_s: float = 0.0
    served_by: dict[str, int] = field(default_factory=dict)
    """Responses per gateway worker index (``-``: no worker header, a single-process gateway or a backend)."""


def lua_script(bodies: Sequence[bytes]) -> str:
    """A wrk script that POSTs ``bodies`` in turn (Lua long strings hold them verbatim)."""
    quoted = ",\n".join(f"[==[{body.decode()}]==]" for body in bodies)
    return LUA_TEMPLATE.format(bodies=quoted, header=WORKER_HEADER)


def run_wrk(
    url: str,
    script: Path,
    connections: int,
    duration_s: float,
    threads: int,
    during: Callable[[], None] | None = None,
) -> Step:
    """One wrk run; its CPU time is the rusage of the children this process reaped meanwhile (wrk alone).
    ``during`` is called once, a fifth into the run (connections are open)."""
    command = ["wrk", "-t", str(min(threads, connections)), "-c", str(connections), "-d", f"{duration_s:g}s"]
    command += ["--latency", "-s", str(script), url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as wrk:
        if during is not None:
            try:
                wrk.wait(duration_s / 5)
            except subprocess.TimeoutExpired:
                during()
        output, errors = wrk.communicate()
    if wrk.returncode != 0:
        raise RuntimeError(f"wrk exited with {wrk.returncode}: {errors[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return parse_wrk(output, connections, cpu_s)


def parse_wrk(output: str, connections: int, wrk_cpu_s: float = 0.0) -> Step:
    """Throughput, p50/p99, errors (socket errors plus non-2xx answers) and who served what, from wrk's report."""
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    percentiles = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", output, re.M))
    errors = sum(int(count) for count in re.findall(r"(?:connect|read|write|timeout) (\d+)", output))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors += int(non_2xx.group(1)) if non_2xx else 0
    total = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m),", output)
    requests, duration_s = (int(total.group(1)), _ms(total.group(2) + total.group(3)) / 1000) if total else (0, 0.0)
    served: dict[str, int] = {}
    for worker, count in re.findall(r"^served-by (\S+) (\d+)$", output, re.M):
        served[worker] = served.get(worker, 0) + int(count)
    return Step(
        connections,
        rate,
        _ms(percentiles["50"]),
        _ms(percentiles["99"]),
        errors,
        requests,
        duration_s,
        wrk_cpu_s,
        served,
    )


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]
