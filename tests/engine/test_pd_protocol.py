"""The KV pull protocol on loopback, in process: framing, the hold registry, the pull server and
client with the simulated block I/O, and the --kv-transfer-config checks."""

import asyncio
import struct

import pytest
from prometheus_client import CollectorRegistry

from engine.core.kv_transfer_blocks import SimBlockIO
from engine.core.kv_transfer_config import KVTransferConfigError, parse_kv_transfer_config
from engine.server.kv_transfer_client import PullFailed, PullTarget, pull_blocks, release_hold
from engine.server.kv_transfer_holds import HoldRegistry
from engine.server.kv_transfer_metrics import TransferMetrics
from engine.server.kv_transfer_params import NO_TRANSFER, transfer_request
from engine.server.kv_transfer_server import PullServer
from engine.server.kv_transfer_wire import MAX_HEADER_BYTES, PullReply, PullRequest, WireError, encode, read_request
from protocol.openai_errors import OpenAIError

HASHES = [bytes([index]) * 16 for index in range(4)]


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def test_framing_round_trips_and_refuses_garbage() -> None:
    async def run() -> None:
        request = PullRequest("pull", "e-1", 2, 2, HASHES[2:], "sim:1B/token:16")
        assert await read_request(reader_of(encode(request))) == request
        with pytest.raises(WireError):
            await read_request(reader_of(struct.pack(">I", MAX_HEADER_BYTES + 1)))
        with pytest.raises(WireError):
            await read_request(reader_of(struct.pack(">I", 3) + b"\xc1\xc1\xc1"))
        with pytest.raises(asyncio.IncompleteReadError):
            await read_request(reader_of(encode(request)[:-2]))

    asyncio.run(run())
    assert encode(PullReply(ok=True))[:4] == struct.pack(">I", len(encode(PullReply(ok=True))) - 4)


def test_hold_registry_serves_one_pull_and_expires_only_idle_holds() -> None:
    holds = HoldRegistry("e", timeout_s=5)
    first = holds.add([3, 4], HASHES[:2], now=0)
    second = holds.add([7], HASHES[:1], now=1)
    assert holds.num_held_blocks == 3
    assert holds.start_pull(first) is not None
    assert holds.start_pull(first) is None, "one pull per hold"
    assert [hold.transfer_id for hold in holds.expired(now=10)] == [second], "a hold being read is not expired"
    finished = holds.finish(first)
    assert finished is not None and finished.block_ids == [3, 4]
    assert holds.finish(first) is None and len(holds) == 0


class Served:
    """A pull server over a hold registry, recording what it unpins."""

    def __init__(self, bandwidth_gbs: float = 1000.0) -> None:
        self.holds = HoldRegistry("e", timeout_s=30)
        self.io = SimBlockIO(bytes_per_token=1000, block_size=16, bandwidth_gbs=bandwidth_gbs)
        self.unpinned: list[list[int]] = []
        self.server = PullServer(self.holds, self.io, self.unpinned.append, TransferMetrics(CollectorRegistry(), "m"))

    async def target(self, transfer_id: str) -> PullTarget:
        return PullTarget("127.0.0.1", await self.server.start("127.0.0.1", 0), transfer_id)


def test_a_pull_gets_matching_blocks_then_the_hold_is_freed() -> None:
    async def run() -> None:
        served = Served()
        transfer_id = served.holds.add([10, 11, 12, 13], HASHES, now=0)
        target = await served.target(transfer_id)
        payload = await pull_blocks(target, 1, HASHES[1:3], served.io.layout, served.io.bytes_per_block, 5)
        assert payload == b""
        assert served.unpinned == [[10, 11, 12, 13]] and len(served.holds) == 0
        with pytest.raises(PullFailed) as gone:
            await pull_blocks(target, 1, HASHES[1:3], served.io.layout, served.io.bytes_per_block, 5)
        assert gone.value.reason == "refused"
        await served.server.stop()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("first", "hashes", "layout", "reason"),
    [
        (0, [b"x" * 16], "sim:1000B/token:16", "mismatch"),
        (0, HASHES[:2], "float32:30x2x16x3x64", "mismatch"),
        (3, HASHES[:2], "sim:1000B/token:16", "refused"),
    ],
)
def test_a_mismatched_pull_gets_nothing_and_frees_the_hold(
    first: int, hashes: list[bytes], layout: str, reason: str
) -> None:
    async def run() -> None:
        served = Served()
        transfer_id = served.holds.add([1, 2, 3, 4], HASHES, now=0)
        with pytest.raises(PullFailed) as failed:
            await pull_blocks(await served.target(transfer_id), first, hashes, layout, 16_000, 5)
        assert failed.value.reason == reason
        assert served.unpinned == [[1, 2, 3, 4]]
        await served.server.stop()

    asyncio.run(run())


def test_a_release_frees_the_hold_and_a_dead_peer_is_unreachable() -> None:
    async def run() -> None:
        served = Served()
        transfer_id = served.holds.add([5, 6], HASHES[:2], now=0)
        target = await served.target(transfer_id)
        await release_hold(target, 5)
        assert served.unpinned == [[5, 6]]
        await served.server.stop()
        with pytest.raises(PullFailed) as failed:
            await pull_blocks(target, 0, HASHES[:2], served.io.layout, served.io.bytes_per_block, 5)
        assert failed.value.reason == "unreachable"

    asyncio.run(run())


def test_a_cancelled_pull_frees_the_hold() -> None:
    """The simulated wire takes 16 kB x 4 / 1 MB/s = 64 ms: cancel the pull in the middle."""

    async def run() -> None:
        served = Served(bandwidth_gbs=0.001)
        transfer_id = served.holds.add([1, 2, 3, 4], HASHES, now=0)
        target = await served.target(transfer_id)
        pull = asyncio.create_task(pull_blocks(target, 0, HASHES, served.io.layout, served.io.bytes_per_block, 5))
        while not served.holds._busy:
            await asyncio.sleep(0.001)
        pull.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pull
        for _ in range(1000):
            if served.unpinned:
                break
            await asyncio.sleep(0.01)
        assert served.unpinned == [[1, 2, 3, 4]] and len(served.holds) == 0
        await served.server.stop()

    asyncio.run(run())


def test_kv_transfer_config_reads_vllm_keys_and_names_what_is_wrong() -> None:
    config = parse_kv_transfer_config('{"kv_role": "kv_both"}')
    assert config.kv_connector == "KvgateConnector" and config.kv_port == 0 and config.hold_timeout_s == 30
    config = parse_kv_transfer_config(
        '{"kv_connector": "KvgateConnector", "kv_role": "kv_producer", "kv_ip": "10.0.0.2", "kv_port": 14579,'
        ' "kv_connector_extra_config": {"hold_timeout_s": 2, "sim_bandwidth_gbs": 50}}'
    )
    assert (config.kv_ip, config.kv_port, config.hold_timeout_s, config.sim_bandwidth_gbs) == ("10.0.0.2", 14579, 2, 50)
    for text, named in [
        ("{bad", "not valid JSON"),
        ('{"kv_role": "kv_both", "kv_connector": "NixlConnector"}', "NixlConnector"),
        ('{"kv_role": "decode"}', "kv_role"),
        ('{"kv_role": "kv_both", "kv_buffer_size": 1}', "kv_buffer_size"),
        ('{"kv_role": "kv_both", "kv_connector_extra_config": {"hold_timeout_s": 0}}', "hold_timeout_s"),
        ('{"kv_role": "kv_both", "kv_port": "x"}', "kv_port"),
    ]:
        with pytest.raises(KVTransferConfigError, match=named):
            parse_kv_transfer_config(text)


def test_kv_transfer_params_are_checked() -> None:
    assert transfer_request({"do_remote_decode": True, "do_remote_prefill": False, "remote_host": None}).remote_decode
    decode = transfer_request(
        {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "e-0",
         "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": 9, "tp_size": 1}
    )  # fmt: skip
    assert decode.source == PullTarget("127.0.0.1", 9, "e-0") and decode.num_remote_blocks == 2
    assert transfer_request({"do_remote_prefill": True, "remote_host": None}) == NO_TRANSFER
    for bad, param in [
        ([], "kv_transfer_params"),
        ({"do_remote_decode": "yes"}, "kv_transfer_params.do_remote_decode"),
        ({"do_remote_prefill": True, "remote_port": "9"}, "kv_transfer_params.remote_port"),
        ({"do_remote_prefill": True, "do_remote_decode": True}, "kv_transfer_params"),
    ]:
        with pytest.raises(OpenAIError) as error:
            transfer_request(bad)
        assert error.value.status == 400 and error.value.body()["error"]["param"] == param
