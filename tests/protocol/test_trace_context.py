"""W3C trace context: a valid caller's trace is continued one hop; anything else starts a new one."""

import re

from protocol.trace_context import continue_trace

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_valid_traceparent_keeps_trace_and_flags_with_a_new_span() -> None:
    trace = continue_trace({"traceparent": CALLER, "tracestate": "congo=t61rcWkgMzE"})
    assert trace.trace_id == "0af7651916cd43dd8448eb211c80319c" and trace.parent_id == "b7ad6b7169203331"
    assert trace.span_id != trace.parent_id and re.fullmatch(r"[0-9a-f]{16}", trace.span_id)
    assert trace.headers() == {
        "traceparent": f"00-{trace.trace_id}-{trace.span_id}-01",
        "tracestate": "congo=t61rcWkgMzE",
    }


def test_missing_or_malformed_traceparents_start_a_new_sampled_trace() -> None:
    for headers in (
        {},
        {"traceparent": "garbage"},
        {"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01"},
        {"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    ):
        trace = continue_trace(headers)
        assert trace.parent_id is None and trace.flags == "01" and trace.trace_id != "0af7651916cd43dd8448eb211c80319c"
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", trace.traceparent)
