"""`kvgate epp`: an Envoy ext_proc endpoint picker (Gateway API Inference Extension) on the gateway's core.

Envoy (Istio, kgateway, agentgateway, ...) streams each HTTP request's headers and body to this
server over ext_proc v3; the picker runs the gateway's own request path up to the routing decision
(tenant, caps, normalization, tokenization, admission, router) and answers the chosen replica in
the ``x-gateway-destination-endpoint`` header and ``envoy.lb`` dynamic metadata, as GIE's
docs/proposals/004-endpoint-picker-protocol/README.md specifies. Envoy then proxies the request
itself; the response phase feeds usage back and releases what the pick held.

One module per job: ``envoy_messages`` reads Envoy's messages, ``wire`` builds the answers,
``pick`` runs the request path, ``usage_reader`` reads usage from a relayed answer,
``stream`` is one ext_proc stream's state machine, ``server`` serves it with gRPC health.
"""
