"""The parts of the gateway a request's path reads, as a protocol: ``gateway.wiring.state.Gateway`` is one.

Only the app factories (``gateway/wiring/app.py``, the picker's ``gateway/epp/server.py``) build the
Gateway; ``gateway/request_path.py`` and the picker's modules are handed it through this type, as
the layering asks (tests/test_layers.py).
"""

from typing import Protocol

from gateway.admission.caps import RequestCaps
from gateway.admission.queue import AdmissionQueue
from gateway.admission.tenants import TenantRegistry
from gateway.admission.tokenize_slots import TokenizeSlots
from gateway.backends.pool import BackendPool
from gateway.config import KvgateConfig
from gateway.dispatch import Dispatcher
from gateway.observability.telemetry import Telemetry
from gateway.openai_request import Endpoint
from gateway.routing.router import Router
from gateway.served_model import ModelRegistry


class RoutingCore(Protocol):
    config: KvgateConfig
    models: ModelRegistry
    pool: BackendPool
    router: Router
    queue: AdmissionQueue
    dispatcher: Dispatcher
    tenants: TenantRegistry
    limits: RequestCaps
    telemetry: Telemetry
    tokenize_slots: TokenizeSlots

    def default_max_tokens(self, endpoint: Endpoint) -> int: ...
