"""The CPU probe and the kernel choice it drives, on whatever CPU runs the tests."""

import torch

from engine.model.cpu_features import DISABLE_ONEDNN_BF16_ENV, DISABLE_ONEDNN_ENV, ONEDNN_BF16_NEEDS, probe_cpu
from engine.model.kernel_choice import choose_kernels

CPU = torch.device("cpu")


def test_the_trial_op_agrees_with_torchs_own_bfloat16_query() -> None:
    cpu = probe_cpu({})
    assert cpu.capability == torch.backends.cpu.get_cpu_capability()
    assert cpu.onednn_bfloat16 == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert cpu.onednn_float32 == torch.backends.mkldnn.is_available()
    assert cpu.fp8_conversion


def test_bfloat16_without_onednn_takes_the_portable_path_and_says_what_is_missing() -> None:
    kernels = choose_kernels(CPU, torch.bfloat16, probe_cpu({}))
    if kernels.packed_linear:
        assert "oneDNN-packed weights" in kernels.summary
    else:
        assert "portable" in kernels.summary and ONEDNN_BF16_NEEDS in kernels.summary
    switched_off = choose_kernels(CPU, torch.bfloat16, probe_cpu({DISABLE_ONEDNN_BF16_ENV: "1"}))
    assert not switched_off.packed_linear and not switched_off.matmul_prefill
    assert f"missing oneDNN bfloat16 (switched off by {DISABLE_ONEDNN_BF16_ENV}=1)" in switched_off.summary
    assert "\n" not in switched_off.summary


def test_each_switch_turns_off_only_its_path() -> None:
    hardware = probe_cpu({})
    no_bf16 = probe_cpu({DISABLE_ONEDNN_BF16_ENV: "1"})
    assert no_bf16.onednn_float32 == hardware.onednn_float32 and not no_bf16.onednn_bfloat16
    no_onednn = probe_cpu({DISABLE_ONEDNN_ENV: "1", DISABLE_ONEDNN_BF16_ENV: "0"})
    assert not no_onednn.onednn_float32 and not no_onednn.onednn_bfloat16
    assert no_onednn.disabled == (DISABLE_ONEDNN_ENV,)
    assert "missing oneDNN (switched off" in choose_kernels(CPU, torch.float32, no_onednn).summary


def test_float16_and_other_devices_use_f_linear() -> None:
    float16 = choose_kernels(CPU, torch.float16, probe_cpu({}))
    assert not float16.packed_linear and "oneDNN path for float16" in float16.summary
    assert not choose_kernels(torch.device("cuda"), torch.bfloat16, None).packed_linear
