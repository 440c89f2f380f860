"""The engine's HTTP side: the OpenAI-compatible aiohttp server (``server``) with its request
checks and response bodies (``openai_checks``, ``openai_responses``, ``responses_*``,
``embeddings``, ``logprobs_echo``), tools and structured output read from a request
(``tool_choice``, ``tool_parser``, ``structured_output``), what it publishes (trace spans in ``tracing``,
load reports in ``load_publisher``) and the KV connector for disaggregated prefill and decode
(``kv_connector``, ``kv_transfer_client``, ``kv_transfer_server``, ...; their shared shapes are in
``engine.core``).
"""
