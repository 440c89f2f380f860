"""The simulator: ``kvgate bench simulate`` and ``simulate-pd`` in virtual time, in one process.

The gateway's own routing, placement and admission code over simulated replicas (the engine's real
scheduler and block manager on a cost model, ``sim_replica``), and models of the peers' routers
(``peer_models``: sglang-router, Dynamo's KV router, llm-d's precise prefix-cache scheduling).
"""
