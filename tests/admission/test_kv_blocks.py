"""kv_blocks.py: what a request reserves, and the 400 for one no replica could ever hold."""

import pytest

from gateway.admission.kv_blocks import blocks_needed, check_fits_some_replica, fits
from gateway.errors import OpenAIError


def test_a_request_that_generates_nothing_reserves_no_blocks() -> None:
    assert blocks_needed(1_430_000, 0, 16) == 0
    assert blocks_needed(20, 1, 16) == 2


def test_a_request_larger_than_a_replica_never_fits_it_even_idle() -> None:
    assert fits(0, 64, 64) and not fits(0, 65, 64) and fits(10**6, 10**6, None)


def test_a_request_larger_than_every_replica_is_a_400_naming_the_largest() -> None:
    check_fits_some_replica("m", 100, 128 * 2000, 16, [1024, None])
    check_fits_some_replica("m", 100, 128 * 2000, 16, [])
    check_fits_some_replica("m", 16, 1008, 16, [64])
    with pytest.raises(OpenAIError) as error:
        check_fits_some_replica("m", 16, 1009, 16, [32, 64])
    assert error.value.status == 400 and error.value.code == "kv_capacity_exceeded"
    assert "65 KV cache blocks" in error.value.message and "holds 64" in error.value.message
