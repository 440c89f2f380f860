"""The engine's scheduling and cache layer, with no torch: a block manager that counts references
to fixed-size KV blocks, caches prefixes and spills to a host tier (``block_manager``,
``host_kv_pool``), session retention hints (``session_retention``, ``session_hint``), sequences
and the continuous-batching scheduler (``sequence``, ``scheduler``), the engine loop that turns
requests into token deltas one step at a time (``llm_engine``, ``detokenizer``), the replica's
configuration and KV budget (``config``, ``kv_budget``), its measured prefill rate
(``prefill_rate``), its KV events (``kv_events``), its counters (``metrics``) and the shapes of KV
transfer between replicas (``kv_transfer_types``, ``kv_transfer_blocks``, ``kv_transfer_config``).
A step is computed by whatever implements ``engine.model.runner_api.ModelRunner``: the real model
(``engine.model``) or the cost model (``engine.sim``). Imports go one way: model, sim, core, server
(tests/test_layers.py).
"""
