"""Replicas over several GPUs: TP shards weights and KV heads, PP splits layers, checked by hand."""

import pytest

from engine.cli import build_parser, config_from_args
from engine.core.kv_budget import KVBudgetError, plan_kv_budget
from planner.arch import ModelArch
from planner.capacity import plan_capacity, smallest_tensor_parallel
from planner.kv_math import kv_bytes_per_sequence, kv_bytes_per_token
from planner.load import load_arch
from planner.parallel import (
    Parallelism,
    ParallelismError,
    gpu_shard,
    stage_layers,
    valid_tensor_parallel_sizes,
    weights_bytes_per_gpu,
)

GIB = 1024**3
TP4 = Parallelism(tensor=4)


def test_llama_3_70b_bf16_tp4_on_80_gb_cards() -> None:
    # Llama-3-70B (hidden 8192, 80 layers, 64 heads / 8 KV heads of 128, MLP 28672, vocab 128256, untied).
    # Published: ~70.6 B parameters, 141 GB of bf16 weights; 320 KiB of bf16 KV per token, which the
    # Hugging Face Llama 3.1 post tabulates as 0.313 GB per 1k tokens (1,024 x 327,680 B = 0.3125 GiB).
    # One GPU of TP 4, per layer:
    #   Q and O        2 x 8192 x 8192 / 4      =  33,554,432
    #   MLP            3 x 8192 x 28672 / 4     = 176,160,768
    #   K and V        2 x 8192 x 1024 / 4      =   4,194,304  (2 of the 8 KV heads)
    #   norms          2 x 8192 (replicated)    =      16,384
    #   layer                                   = 213,925,888 x 80 layers = 17,114,071,040
    #   embedding + head 2 x 128256 x 8192 / 4  =   525,336,576;  final norm 8,192
    #   parameters per GPU                      = 17,639,415,808 -> x 2 B = 35,278,831,616 B (32.86 GiB)
    # usable: 80 GB x 0.9                       = 72,000,000,000 B
    # left for KV: 72e9 - 35,278,831,616 - 2 GiB = 34,573,684,736 B
    # KV per token per GPU: 2 x 80 layers x 2 KV heads x 128 x 2 B = 81,920 B (80 KiB)
    # KV tokens: 34,573,684,736 // 81,920       = 422,042
    # one sequence of 4,096 tokens: 4,096 x 81,920 = 335,544,320 B -> 34,573,684,736 // it = 103 sequences
    arch = load_arch("llama-3-70b")
    assert arch.param_count == pytest.approx(70.6e9, rel=0.001)
    assert kv_bytes_per_sequence(arch, 1024, "bf16") == 0.3125 * GIB
    plan = plan_capacity(arch, gpu_memory_bytes=80 * 10**9, prompt_tokens=4096, parallel=TP4)
    (gpu,) = plan.stages
    assert gpu.weights_bytes == 35_278_831_616
    assert gpu.kv_budget_bytes == 34_573_684_736
    assert gpu.kv_bytes_per_token == 81_920
    assert (gpu.kv_tokens, plan.kv_tokens) == (422_042, 422_042)
    assert gpu.sequence_bytes == 335_544_320
    assert plan.max_sequences == 103
    # The replica: 4 x the per-GPU figures; its weights exceed the model's 141,107,412,992 B by
    # the norms each of the 4 GPUs holds whole (3 extra copies of 80 x 16,384 + 8,192, at 2 B).
    assert plan.replica_weights_bytes == 4 * 35_278_831_616 == 141_107_412_992 + 3 * (80 * 16_384 + 8_192) * 2
    assert plan.replica_kv_budget_bytes == 4 * 34_573_684_736
    assert plan.replica_sequence_bytes == 4096 * 327_680


def test_tp2_weights_match_the_14b_figure_vllm_logged() -> None:
    # vLLM issue 13061: DeepSeek-R1-Distill-Qwen-14B (a Qwen2.5-14B) with tensor_parallel_size 2
    # logs "Loading model weights took 13.9476 GB" per GPU (vLLM divides by 2**30). The estimate
    # counts parameters only (13.756 GiB); vLLM measures allocated memory, a little more.
    config = {
        "model_type": "qwen2", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
        "num_key_value_heads": 8, "intermediate_size": 13824, "vocab_size": 152064,
        "tie_word_embeddings": False, "max_position_embeddings": 131072,
    }  # fmt: skip
    arch = ModelArch.from_hf_config(config)
    assert weights_bytes_per_gpu(arch, "bf16", Parallelism(tensor=2), 0) / GIB == pytest.approx(13.9476, rel=0.02)


def test_kv_heads_fewer_than_tp_are_replicated() -> None:
    # Llama-3-70B has 8 KV heads: up to TP 8 each GPU's KV per token shrinks; at TP 16 each GPU
    # still holds one whole KV head (each head on 2 GPUs), as vLLM does.
    arch = load_arch("llama-3-70b")
    per_gpu = {tp: kv_bytes_per_token(gpu_shard(arch, Parallelism(tp), 0), "bf16") for tp in (1, 2, 4, 8, 16)}
    assert per_gpu == {1: 327_680, 2: 163_840, 4: 81_920, 8: 40_960, 16: 40_960}
    # the replica holds 16 x 40,960 B per token: twice the model's 327,680
    plan = plan_capacity(arch, gpu_memory_bytes=80 * 10**9, prompt_tokens=1000, parallel=Parallelism(16))
    assert plan.replica_sequence_bytes == 2 * kv_bytes_per_sequence(arch, 1000, "bf16")
    # K/V projection weights stop shrinking too: per layer 2 x 8192 x 128 (one head) on each GPU
    tp8, tp16 = (weights_bytes_per_gpu(arch, "bf16", Parallelism(tp), 0) for tp in (8, 16))
    q_o_mlp_per_layer = 2 * 8192 * 8192 + 3 * 8192 * 28672
    embeddings = 2 * 128256 * 8192
    assert tp8 - tp16 == 2 * (80 * (q_o_mlp_per_layer // 8 - q_o_mlp_per_layer // 16) + embeddings // 16)


def test_mla_latent_is_whole_on_every_tp_rank() -> None:
    arch = load_arch("deepseek-v3")
    assert kv_bytes_per_token(gpu_shard(arch, Parallelism(8), 0), "bf16") == 61 * 576 * 2


def test_tp_degrees_the_heads_allow() -> None:
    assert valid_tensor_parallel_sizes(load_arch("llama-3-70b")) == [1, 2, 4, 8, 16, 32, 64]
    assert valid_tensor_parallel_sizes(load_arch("qwen2-7b")) == [1, 2, 4, 28]  # 28 heads, 4 KV heads
    with pytest.raises(ParallelismError, match="does not divide the 64 attention heads"):
        Parallelism(3).check(load_arch("llama-3-70b"))
    with pytest.raises(ParallelismError, match="exceeds the 30 layers"):
        Parallelism(pipeline=31).check(load_arch("smollm2-135m"))


def test_pipeline_stages_split_layers_as_vllm() -> None:
    # remainder layers go to the stages before the last
    assert [len(stage) for stage in stage_layers(80, 3)] == [27, 27, 26]
    assert [len(stage) for stage in stage_layers(61, 2)] == [31, 30]
    assert [len(stage) for stage in stage_layers(62, 4)] == [15, 16, 16, 15]
    assert stage_layers(61, 2)[1] == range(31, 61)


def test_pipeline_halves_each_gpus_layers_and_splits_embedding_from_head() -> None:
    arch = load_arch("llama-3-70b")
    pp2 = Parallelism(pipeline=2)
    assert kv_bytes_per_token(gpu_shard(arch, pp2, 0), "bf16") == 40 * 8 * 128 * 2 * 2
    first, last = (weights_bytes_per_gpu(arch, "bf16", pp2, stage) for stage in (0, 1))
    assert last - first == 8192 * 2  # identical halves, but the last stage also holds the final norm
    assert arch.params is not None and first + last == arch.params.total * 2
    # tied embeddings: with PP the last stage holds its own copy as output head
    tied = load_arch("smollm2-135m")
    assert tied.params is not None and tied.params.lm_head == 0
    two_stages = [weights_bytes_per_gpu(tied, "bf16", Parallelism(pipeline=2), stage) for stage in (0, 1)]
    assert sum(two_stages) == (tied.params.total + tied.params.embedding) * 2


def test_pipeline_capacity_is_the_tightest_stage() -> None:
    plan = plan_capacity(
        load_arch("deepseek-v3"), gpu_memory_bytes=141 * 10**9, prompt_tokens=8192, parallel=Parallelism(8, 2)
    )
    assert [gpu.layers for gpu in plan.stages] == [31, 30]
    assert plan.max_sequences == min(gpu.max_sequences for gpu in plan.stages)
    assert plan.kv_tokens == min(gpu.kv_tokens for gpu in plan.stages)


def test_smallest_tp_for_a_concurrency() -> None:
    arch = load_arch("llama-3-70b")
    plan = plan_capacity(arch, gpu_memory_bytes=80 * 10**9, prompt_tokens=4096)
    assert plan.max_sequences == 0  # 131 GiB of weights on one 80 GB card
    answer = smallest_tensor_parallel(arch, plan, 32)
    assert answer.tensor == 4
    assert answer.tried == {1: 0, 2: 0, 4: 103}
    assert smallest_tensor_parallel(arch, plan, 104).tensor == 8
    assert smallest_tensor_parallel(arch, plan, 10**6).tensor is None


def test_engine_budget_for_a_replica_over_four_gpus() -> None:
    config = config_from_args(
        build_parser().parse_args(["--device", "cuda", "--gpu-memory-utilization", "0.9", "--dtype", "bfloat16"])
    )
    arch = load_arch("llama-3-70b")

    def card() -> tuple[int, int]:
        return 80 * 10**9, 80 * 10**9

    with pytest.raises(KVBudgetError):  # one GPU cannot hold the weights
        plan_kv_budget(config, arch, card)
    budget = plan_kv_budget(config, arch, card, TP4)
    # per GPU: 72e9 usable - 1 GiB reserve - 35,278,831,616 B of weights, in blocks of 16 x 81,920 B
    assert budget.bytes_per_token == 81_920
    assert budget.num_blocks == (72 * 10**9 - GIB - 35_278_831_616) // (81_920 * config.block_size)
    assert "per GPU of TP 4 x PP 1" in budget.describe()
