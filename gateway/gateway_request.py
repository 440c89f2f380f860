"""One client request as the gateway carries it, in the spirit of vLLM's v1 ``Request`` and
mini-sglang's ``Req``.

The handler (gateway/handler.py) makes it when the request arrives and fills it in as each step
of the request path learns its part: who sent it, what it asks, what it resolves to, its prompt,
how it is routed, and what is forwarded (with the granted cap). Telemetry reads it whole, however
the request ends: answered, refused at any step, or abandoned by its client.
"""

import time
from dataclasses import dataclass, field

from gateway.admission.tenants import Tenant
from gateway.dispatch import Forwarding
from gateway.openai_request import ParsedRequest
from gateway.routing.types import RouteRequest
from gateway.served_model import ModelTarget
from normalize.normalizer import NormalizedRequest
from normalize.segment_tokenizer import EncodedPrompt


@dataclass
class GatewayRequest:
    request_id: str
    """The client's ``x-request-id`` or one of the gateway's own: echoed and logged only."""
    trace_id: str | None = None
    """The trace the request log names (the OpenTelemetry root span's when tracing is on)."""
    started: float = field(default_factory=time.perf_counter)
    """Arrival, on ``time.perf_counter()``."""
    tenant: Tenant | None = None
    parsed: ParsedRequest | None = None
    target: ModelTarget | None = None
    """What the client's ``model`` resolved to: the served model, and the adapter if it named one."""
    normalized: NormalizedRequest | None = None
    prompts: list[EncodedPrompt] = field(default_factory=list)
    """The prompt's token ids, one per prompt or input (as the backend will see them)."""
    route: RouteRequest | None = None
    """The request as routing sees it: block hashes, token counts, session."""
    forwarding: Forwarding | None = None
    """What goes to the backend, and how far forwarding got."""

    @property
    def tenant_name(self) -> str | None:
        return self.tenant.name if self.tenant is not None else None

    @property
    def stream(self) -> bool:
        return self.parsed is not None and self.parsed.stream
