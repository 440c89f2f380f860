"""The ext_proc channel every end-to-end test of the picker opens to its module's ``picker``."""

from collections.abc import AsyncIterator

import grpc
import pytest

from tests.epp.picker_process import Picker


@pytest.fixture
async def channel(picker: Picker) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(picker.grpc_target) as opened:
        yield opened
