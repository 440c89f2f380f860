"""With no replica left, readiness turns NOT_SERVING (liveness stays SERVING) and a pick is a 503
ImmediateResponse: GIE's "no ready endpoints" answer."""

import asyncio
import time
from collections.abc import Iterator

import grpc
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.errors import service_unavailable
from tests.bodies import MODEL, chat
from tests.epp.envoy_flows import OPEN_KEY, buffered_pick, nothing_held
from tests.epp.picker_process import Picker, picker_for, wait_until


@pytest.fixture(scope="module")
def picker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Picker]:
    with picker_for(
        tmp_path_factory.mktemp("epp-ready"), 1, tenants=[{"name": "open", "api_keys": [OPEN_KEY]}]
    ) as started:
        yield started


async def health(target: str, service: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))
        return reply.status


async def until_status(target: str, service: str, status: int, timeout_s: float = 30.0) -> None:
    """Wait for ``service`` to report ``status`` (readiness follows the replicas' health checks)."""
    deadline = time.monotonic() + timeout_s
    while (now := await health(target, service)) != status:
        assert time.monotonic() < deadline, (target, service, now)
        await asyncio.sleep(0.05)


async def test_no_replica_left_is_not_ready_and_picks_answer_503(picker: Picker, channel: grpc.aio.Channel) -> None:
    assert await health(picker.health_target, "readiness") == health_pb2.HealthCheckResponse.SERVING
    picker.replicas[0].kill()
    wait_until(lambda: not picker.admin()["backends"][0]["healthy"])
    envoy, immediate = await buffered_pick(channel, chat("anyone there?"), request_id="req-none-ready")
    expected = service_unavailable(f"No healthy replica of '{MODEL}' is available.", retry_after_s=1)
    assert immediate.immediate_response.status.code == 503
    assert immediate.immediate_response.body == orjson.dumps(expected.body())
    envoy.cancel()
    for service in ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""):
        for target in (picker.health_target, picker.grpc_target):
            await until_status(target, service, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert await health(picker.health_target, "liveness") == health_pb2.HealthCheckResponse.SERVING
    wait_until(lambda: nothing_held(picker))
