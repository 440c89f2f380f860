"""The engine's part of a request's trace: `engine.request` with its queue, prefill and decode spans.

The spans are written when a sequence finishes, from the times the engine thread noted, as
children of the caller's ``traceparent`` (the gateway's upstream span). With tracing off they
are non-recording and cost next to nothing.
"""

import time

from opentelemetry import context, trace

from engine.core.llm_engine import RequestOutput
from protocol.tracing import tracer, tracing_enabled


def record_spans(parent: context.Context, final: RequestOutput, request_id: str) -> None:
    times = final.times
    if times is None or not tracing_enabled():
        return
    offset_ns = time.time_ns() - time.monotonic_ns()

    def epoch_ns(monotonic_s: float) -> int:
        return offset_ns + int(monotonic_s * 1e9)

    attributes: dict[str, str | int] = {
        "kvgate.request_id": request_id,
        "kvgate.choice_index": final.index,
        "kvgate.prompt_tokens": final.num_prompt_tokens,
        "kvgate.cached_tokens": final.num_cached_tokens,
        "kvgate.output_tokens": final.num_output_tokens,
    }
    root = tracer().start_span(
        "engine.request", parent, trace.SpanKind.SERVER, attributes, start_time=epoch_ns(times.arrival)
    )
    inside = trace.set_span_in_context(root, parent)
    phases = (
        ("engine.queue", times.arrival, times.scheduled),
        ("engine.prefill", times.scheduled, times.first_token),
        ("engine.decode", times.first_token, times.finished),
    )
    for name, start, end in phases:
        tracer().start_span(name, inside, start_time=epoch_ns(start)).end(end_time=epoch_ns(end))
    root.end(end_time=epoch_ns(times.finished))
