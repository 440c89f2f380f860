"""OpenTelemetry spans for gateway and engine: one process-wide tracer, off unless configured.

Without ``configure_tracing`` the OpenTelemetry API hands out non-recording spans, so the
instrumented code costs next to nothing and sends no ``traceparent`` of its own; the gateway
then still propagates the caller's trace with ``protocol.trace_context``. With it, spans go to
an OTLP/HTTP collector (``opentelemetry-exporter-otlp-proto-http``, installed separately) or,
in tests, to any exporter given. W3C ``traceparent`` carries the trace between processes.
"""

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from protocol.trace_context import is_visible_ascii

TRACER_NAME = "kvgate"


def otlp_exporter(endpoint: str) -> SpanExporter:
    """An OTLP/HTTP exporter to ``endpoint`` (e.g. http://collector:4318/v1/traces)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise RuntimeError(
            "OTLP export needs the opentelemetry-exporter-otlp-proto-http package: "
            "pip install opentelemetry-exporter-otlp-proto-http"
        ) from exc
    return OTLPSpanExporter(endpoint=endpoint)


def configure_tracing(service_name: str, exporter: SpanExporter, batch: bool = True) -> TracerProvider:
    """Install the process-wide tracer provider (once per process; later calls keep the first)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    global _enabled
    _enabled = True
    return provider


_TRACER = trace.get_tracer(TRACER_NAME)
"""A proxy: it hands out non-recording spans until ``configure_tracing`` installs a provider, then real ones."""
_enabled = False


def tracer() -> trace.Tracer:
    return _TRACER


def tracing_enabled() -> bool:
    return _enabled


def span(name: str, **options: Any) -> AbstractContextManager[trace.Span | None]:
    """``tracer().start_as_current_span(name, ...)`` when tracing is on, else a no-op yielding None.

    Skipping the OpenTelemetry API entirely when off saves about 7 us a span (context attach and
    detach), which on the gateway's request path is most of its own overhead.
    """
    return tracer().start_as_current_span(name, **options) if _enabled else nullcontext()


_PROPAGATION_HEADERS = ("traceparent", "tracestate", "baggage")
_MAX_PROPAGATION_CHARS = 8192
"""W3C baggage allows 8,192 bytes; trace headers are far shorter."""


def remote_parent(headers: Mapping[str, str]) -> context.Context:
    """The context a caller's ``traceparent`` / ``tracestate`` / ``baggage`` headers describe (empty
    when absent). A header that is not printable ASCII is ignored: OpenTelemetry's propagators
    raise on bytes that are not UTF-8, and what they extract is injected into the next hop's head."""
    carrier = {}
    for name in _PROPAGATION_HEADERS:
        value = headers.get(name)
        if value is not None and len(value) <= _MAX_PROPAGATION_CHARS and is_visible_ascii(value):
            carrier[name] = value
    return propagate.extract(carrier)


def inject_current(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` with the current span's ``traceparent`` when a span is recording, else unchanged.

    (A non-recording span still carries its remote parent's ids; injecting those would hand the
    next hop the caller's span instead of this one.)
    """
    if _enabled and trace.get_current_span().is_recording():
        propagate.inject(headers)
    return headers
