"""Concurrent sequences per card, checked against arithmetic done by hand."""

from planner.capacity import plan_capacity
from planner.load import load_arch
from planner.sizes import format_bytes, parse_memory_size

GIB = 1024**3


def test_qwen2_7b_on_a_24_gib_card_fits_24_sequences_of_4096_tokens() -> None:
    # Qwen2-7B parameters from its config.json (hidden 3584, 28 layers, 4 KV heads of 128, MLP 18944,
    # vocab 152064, untied head, QKV bias):
    #   embeddings + head  2 x 152,064 x 3,584                          = 1,089,994,752
    #   attention          28 x (2x3584x3584 + 2x3584x512 + 3584+2x512) =   822,212,608
    #   MLP                28 x 3 x 3,584 x 18,944                      = 5,703,204,864
    #   norms              2 x 3,584 x 28 + 3,584                       =       204,288
    #   total                                                           = 7,615,616,512
    # bf16 weights: 2 bytes each                                       = 15,231,233,024 B (14.19 GiB)
    # usable: 24 GiB x 0.9 = 25,769,803,776 x 0.9                       = 23,192,823,398 B
    # left for KV: 23,192,823,398 - 15,231,233,024 - 2 GiB overhead     =  5,814,106,726 B (5.41 GiB)
    # one sequence: 4,096 tokens (3,584 prompt + 512 output) x 56 KiB   =    234,881,024 B (224 MiB)
    # 5,814,106,726 / 234,881,024 = 24.75 -> 24 sequences
    plan = plan_capacity(
        load_arch("qwen2-7b"),
        gpu_memory_bytes=24 * GIB,
        prompt_tokens=3584,
        output_tokens=512,
        kv_dtype="bf16",
        weights_dtype="bf16",
        utilization=0.9,
        overhead_bytes=2 * GIB,
    )
    assert plan.stages[0].weights_bytes == 15_231_233_024
    assert plan.stages[0].kv_budget_bytes == 5_814_106_726
    assert plan.stages[0].sequence_bytes == 234_881_024
    assert plan.max_sequences == 24


def test_output_tokens_count_against_the_budget() -> None:
    arch = load_arch("qwen2-7b")
    prompt_only = plan_capacity(arch, gpu_memory_bytes=24 * GIB, prompt_tokens=3584).max_sequences
    with_output = plan_capacity(arch, gpu_memory_bytes=24 * GIB, prompt_tokens=3584, output_tokens=512).max_sequences
    assert (prompt_only, with_output) == (28, 24)


def test_weights_larger_than_the_card_leave_no_sequences() -> None:
    plan = plan_capacity(load_arch("llama-2-70b"), gpu_memory_bytes=24 * GIB, prompt_tokens=4096)
    assert plan.stages[0].kv_budget_bytes == 0
    assert plan.max_sequences == 0


def test_int4_weights_make_room_for_70b_on_80_gb() -> None:
    arch = load_arch("llama-3-70b")
    assert plan_capacity(arch, gpu_memory_bytes=80 * 10**9, prompt_tokens=4096, weights_dtype="bf16").max_sequences == 0
    assert plan_capacity(arch, gpu_memory_bytes=80 * 10**9, prompt_tokens=4096, weights_dtype="int4").max_sequences > 0


def test_memory_sizes() -> None:
    assert parse_memory_size("24GiB") == 24 * GIB
    assert parse_memory_size("80GB") == 80 * 10**9
    assert parse_memory_size("24") == 24 * GIB
    assert parse_memory_size("1.5 tib") == int(1.5 * 1024**4)
    assert format_bytes(int(1.25 * GIB)) == "1.25 GiB"
    assert format_bytes(512) == "512 B"
