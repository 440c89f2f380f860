"""Which attention backend a runner picks, and the log line that says why on CUDA."""

import logging

import pytest
import torch

from engine.model.flashinfer_attention import flashinfer_available, select_backend

CUDA = torch.device("cuda")


def test_cpu_always_takes_the_portable_path() -> None:
    assert select_backend(torch.device("cpu"), torch.bfloat16, "auto", True) == "portable"


def test_cuda_float32_falls_back_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="engine.model.flashinfer_attention"):
        assert select_backend(CUDA, torch.float32, "auto", True) == "portable"
    assert "float16/bfloat16" in caplog.text


@pytest.mark.parametrize(
    ("kv_cache_dtype", "same_dtype", "reason"),
    [("fp8", False, "per-block scales"), ("float16", False, "another dtype")],
)
def test_cuda_kv_flashinfer_cannot_read_falls_back_with_a_log_line(
    kv_cache_dtype: str, same_dtype: bool, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="engine.model.flashinfer_attention"):
        assert select_backend(CUDA, torch.bfloat16, kv_cache_dtype, same_dtype) == "portable"
    assert reason in caplog.text


def test_cuda_uses_flashinfer_where_installed_and_says_so_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="engine.model.flashinfer_attention"):
        backend = select_backend(CUDA, torch.bfloat16, "auto", True)
    if flashinfer_available():
        assert backend == "flashinfer"
    else:
        assert backend == "portable"
        assert "FlashInfer is not installed" in caplog.text
