"""A request the picker holds in the admission queue (every replica full) leaves nothing behind when
Envoy cancels it there, and the queue still hands the freed slot to the next request."""

import asyncio
from collections.abc import Iterator

import grpc
import orjson
import pytest

from tests.bodies import chat
from tests.epp.envoy_flows import DESTINATION, buffered_pick, nothing_held, set_headers
from tests.epp.envoy_sequences import BUFFERED, EnvoySide, request_body, request_headers
from tests.epp.picker_process import Picker, picker_for, wait_until

KEY = "key-queue"
REPLICA_KEY = "replica-secret"
"""The replica's own API key (``backends[].api_key``): the pick sends it in place of the tenant's."""


@pytest.fixture(scope="module")
def picker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Picker]:
    with picker_for(
        tmp_path_factory.mktemp("epp-queue"),
        1,
        every_backend={"max_concurrency": 1, "api_key": REPLICA_KEY},
        tenants=[{"name": "queued", "api_keys": [KEY]}],
    ) as started:
        yield started


async def queued(channel: grpc.aio.Channel, content: str) -> tuple[EnvoySide, asyncio.Task]:
    """A buffered request whose pick is awaited in the background (it waits in the queue)."""
    raw = orjson.dumps(chat(content, max_tokens=2))
    envoy = EnvoySide(channel)
    await envoy.send(request_headers(raw, KEY, request_mode=BUFFERED))
    await envoy.answer()
    await envoy.send(request_body(raw, end_of_stream=True))
    return envoy, asyncio.create_task(envoy.answer())


async def test_a_stream_cancelled_in_the_queue_frees_its_place_and_the_next_gets_the_slot(
    picker: Picker, channel: grpc.aio.Channel
) -> None:
    holder, answer = await buffered_pick(channel, chat("I hold the only slot", max_tokens=2), KEY)
    assert set_headers(answer, "request_body")[DESTINATION]
    assert set_headers(answer, "request_body")["authorization"] == f"Bearer {REPLICA_KEY}".encode()
    assert answer.request_body.response.header_mutation.remove_headers == ["x-api-key"]
    waiting, pending = await queued(channel, "I wait, then leave")
    wait_until(lambda: picker.admin()["queued"] == {"queued": 1})
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    wait_until(lambda: picker.admin()["queued"] == {})
    assert picker.admin()["tenants_in_flight"]["queued"] == 1
    successor, next_pick = await queued(channel, "I wait, then get the slot")
    wait_until(lambda: picker.admin()["queued"] == {"queued": 1})
    holder.cancel()
    answer = await asyncio.wait_for(next_pick, 30)
    assert set_headers(answer, "request_body")[DESTINATION] == picker.engines[0].encode()
    assert answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION].string_value == picker.engines[0]
    successor.cancel()
    wait_until(lambda: nothing_held(picker))
