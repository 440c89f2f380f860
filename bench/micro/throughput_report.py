"""What ``kvgate bench throughput`` measured and how it prints it: each step, the table, and the
ratio of 2 workers to 1, measured and implied by the CPU each side spent per request.

The arithmetic: on a host of ``cores`` CPUs, a gateway of ``workers`` processes costing G of CPU a
request, in front of a backend costing B, driven by wrk costing W, serves at most
``min(workers / G, cores / (G + B + W))`` requests a second. G moves with the host's load too
(caches, preemption: ~630 us on a calm moment of this host, ~1,100 us at load 13), so the
ratio of two targets is read from steps run close together (the bench interleaves them).
"""

import os
import statistics
from dataclasses import dataclass, field

from bench.harness.wrk import Step


@dataclass
class Measured:
    """One step and the CPU each side spent in it (seconds)."""

    step: Step
    gateway_s: float
    worker_s: dict[str, float]
    """Each gateway process's CPU, by worker index ("-": a single-process gateway, or the parent)."""
    backend_s: float
    worker_connections: dict[str, int] = field(default_factory=dict)
    """Client connections each worker held (``ss``, a fifth into the step)."""
    load: float = 0.0
    """The 1-minute load average at the end of the step."""


@dataclass
class Result:
    name: str
    workers: int
    """Gateway processes that serve requests (0: the backend alone or a multi-threaded router)."""
    idle_cpu_per_s: dict[str, float] = field(default_factory=dict)
    """Each gateway process's background CPU while idle (seconds of CPU per second)."""
    steps: list[Measured] = field(default_factory=list)

    def per_request_us(self, side: str) -> float:
        """CPU per request of ``gateway``, ``backend`` or ``wrk`` over all steps."""
        requests = sum(measured.step.requests for measured in self.steps)
        if side == "wrk":
            spent = sum(measured.step.wrk_cpu_s for measured in self.steps)
        else:
            spent = sum(getattr(measured, f"{side}_s") for measured in self.steps)
        return spent / requests * 1e6 if requests else 0.0

    def ceiling(self, cores: int) -> float:
        """req/s an idle host of ``cores`` would allow, from the CPU each side spent per request."""
        gateway, rest = self.per_request_us("gateway"), self.per_request_us("backend") + self.per_request_us("wrk")
        limits = [cores / (gateway + rest) * 1e6] if gateway + rest else []
        limits += [self.workers / gateway * 1e6] if gateway and self.workers else []
        return min(limits) if limits else 0.0

    def best(self, bound_ms: float) -> Step | None:
        """The fastest step with no errors and p99 under the bound."""
        good = [m.step for m in self.steps if m.step.errors == 0 and m.step.p99_ms < bound_ms]
        return max(good, key=lambda step: step.requests_per_s, default=None)

    def top(self) -> Step | None:
        return max((m.step for m in self.steps), key=lambda step: step.requests_per_s, default=None)


def step_line(name: str, measured: Measured, bound_ms: float) -> str:
    step = measured.step
    good = step.errors == 0 and step.p99_ms < bound_ms
    requests = max(step.requests, 1)
    line = (
        f"   {name:26s} c={step.connections:3d}: {step.requests_per_s:6.0f} req/s  p50 {step.p50_ms:6.2f}"
        f"  p99 {step.p99_ms:7.2f} ms  err {step.errors}{'' if good else ' (over bound)'}  CPU us/req:"
        f" gateway {measured.gateway_s / requests * 1e6:4.0f} backend {measured.backend_s / requests * 1e6:3.0f}"
        f" wrk {step.wrk_cpu_s / requests * 1e6:3.0f}"
    )
    served = {worker: count for worker, count in step.served_by.items() if worker != "-"}
    if served:
        line += "  served " + " ".join(
            f"w{worker} {count / requests:.0%} ({measured.worker_s.get(worker, 0) / max(count, 1) * 1e6:.0f} us,"
            f" {measured.worker_connections.get(worker, '?')} conn)"
            for worker, count in sorted(served.items())
        )
    spent = measured.gateway_s + measured.backend_s + step.wrk_cpu_s
    share = spent / max(step.duration_s, 1e-9) / (os.cpu_count() or 1)
    return line + f"  host share {share:.0%}  load {measured.load:.1f}"


def report(results: list[Result], bound_ms: float, cores: int) -> None:
    print(
        f"\n| target | best req/s, p99 < {bound_ms:g} ms (c) | max req/s (c) | CPU us/req: gateway | backend | wrk"
        " | idle-host ceiling req/s | idle CPU ms/s | load over its steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for result in results:
        idle = ", ".join(
            f"{'w' + index if index != '-' else 'main'} {share * 1e3:.1f}"
            for index, share in sorted(result.idle_cpu_per_s.items())
        )
        loads = [measured.load for measured in result.steps]
        print(
            f"| {result.name} | {_rate(result.best(bound_ms))} | {_rate(result.top())}"
            f" | {result.per_request_us('gateway'):.0f} | {result.per_request_us('backend'):.0f}"
            f" | {result.per_request_us('wrk'):.0f} | {result.ceiling(cores):.0f} | {idle or '-'}"
            f" | {min(loads, default=0):.1f}-{max(loads, default=0):.1f} |"
        )
    by_workers = {result.workers: result for result in results if result.name.startswith("kvgate")}
    if 1 in by_workers and 2 in by_workers:
        print(ratio_line(by_workers[1], by_workers[2], bound_ms, cores))


def ratio_line(one: Result, two: Result, bound_ms: float, cores: int) -> str:
    paired = [
        b.step.requests_per_s / a.step.requests_per_s
        for a, b in zip(one.steps, two.steps, strict=False)
        if a.step.connections == b.step.connections and a.step.requests_per_s
    ]
    best_one, best_two = one.best(bound_ms), two.best(bound_ms)
    within = f"{best_two.requests_per_s / best_one.requests_per_s:.2f}x" if best_one and best_two else "n/a"
    top_one, top_two = one.top(), two.top()
    top = f"{top_two.requests_per_s / top_one.requests_per_s:.2f}x" if top_one and top_two else "n/a"
    median = f"{statistics.median(paired):.2f}x" if paired else "n/a"
    return (
        f"\n2 workers / 1 worker: {within} (best within the bound), {top} (highest steps), {median} (median over"
        f" connection counts of steps run back to back); implied by the CPU per request on an idle {cores}-core"
        f" host: {two.ceiling(cores) / max(one.ceiling(cores), 1):.2f}x"
    )


def _rate(step: Step | None) -> str:
    return f"{step.requests_per_s:.0f} ({step.connections})" if step else "none"
