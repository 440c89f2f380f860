"""What computes a step: the runner contract the scheduler calls (``runner_api``) and the torch
model behind it (``model_runner``): the Llama-family forward (``llama``) over the paged KV pool
(``kv_cache``), its attention backends (``attention``, ``matmul_attention``,
``flashinfer_attention``) and CPU kernels (``onednn``, ``cpu_features``, ``kernel_choice``,
``omp_team``, ``malloc_arena``), sampling (``sampler``), grammar masks (``grammar``), embeddings
and prompt logprobs from the hidden states (``pooling``, ``logprobs_prompt``), LoRA adapters
(``lora_modules``, ``lora_weights``, ``lora_batch``) and the weights' loader (``loader``).
Nothing here imports the rest of the engine.
"""
