"""What the picker reads from Envoy's ext_proc messages: headers, the subset hint, the served endpoint.

Envoy sends header values in ``raw_value`` (bytes) and leaves ``value`` empty since it deprecated
``value`` for ext_proc (envoy/config/core/v3/base.proto, ``HeaderValue``); both are read. The subset
hint and the served endpoint come in ``metadata_context.filter_metadata`` as GIE's
docs/proposals/004-endpoint-picker-protocol/README.md lays out.
"""

from envoy.service.ext_proc.v3.external_processor_pb2 import HttpHeaders, ProcessingRequest
from google.protobuf.struct_pb2 import Value
from multidict import CIMultiDict, CIMultiDictProxy

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
"""The subset key, in the hint namespace or, for data planes that send it so, as a comma-separated header."""
SERVED_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"


def header_map(headers: HttpHeaders) -> CIMultiDictProxy[str]:
    """Envoy's header map as case-insensitive text headers (bytes that are not UTF-8 become U+FFFD)."""
    found: CIMultiDict[str] = CIMultiDict()
    for header in headers.headers.headers:
        value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
        found.add(header.key, value)
    return CIMultiDictProxy(found)


def subset_hint(request: ProcessingRequest, headers: CIMultiDictProxy[str]) -> frozenset[str] | None:
    """The endpoints (``ip:port``) the pick must come from; None when the data plane set no subset.

    An empty set is a hint too: nothing is eligible (503)."""
    namespace = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is not None and SUBSET_KEY in namespace.fields:
        return frozenset(_strings(namespace.fields[SUBSET_KEY]))
    given = headers.get(SUBSET_KEY)
    if given is None:
        return None
    return frozenset(part.strip() for part in given.split(",") if part.strip())


def served_endpoint(request: ProcessingRequest) -> str | None:
    """The endpoint that served the request, as the data plane reports it with the response."""
    namespace = request.metadata_context.filter_metadata.get(SERVED_NAMESPACE)
    if namespace is None or SERVED_KEY not in namespace.fields:
        return None
    values = _strings(namespace.fields[SERVED_KEY])
    return values[0] if values else None


def _strings(value: Value) -> list[str]:
    """A metadata value as endpoint strings: a list of strings, or one comma-separated string."""
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [item.string_value for item in value.list_value.values if item.string_value]
    if kind == "string_value":
        return [part.strip() for part in value.string_value.split(",") if part.strip()]
    return []
