"""`kvgate epp` end to end: real simulated engines, the real picker process, and a gRPC client that
sends the message sequences Envoy sends (tests/epp/envoy_sequences.py), playing Envoy's part by
forwarding the picked request to the picked engine and relaying its real answer back.

No Envoy binary can be installed here (none in Debian 12's archive, none on PyPI), so the data
plane is this client; the answers are checked byte for byte against what Envoy reads.
"""

import asyncio
import json
from collections.abc import Iterator

import grpc
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.admission.limiter import concurrency_exceeded
from gateway.errors import service_unavailable
from protocol.load_mark import LOAD_MARK_HEADER, parse_load_mark
from tests.bodies import MODEL, chat
from tests.epp.envoy_flows import (
    CAPPED_KEY,
    DESTINATION,
    OPEN_KEY,
    buffered_pick,
    endpoints_of,
    finish_whole,
    forward,
    forwarded_body,
    nothing_held,
    set_headers,
)
from tests.epp.envoy_sequences import (
    BUFFERED,
    FULL_DUPLEX,
    STREAMED,
    EnvoySide,
    request_body,
    request_headers,
    response_body,
    response_headers,
)
from tests.epp.picker_process import Picker, picker_for, wait_until
from tests.procs import kvgate_cmd


@pytest.fixture(scope="module")
def picker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Picker]:
    tenants = [
        {"name": "capped", "api_keys": [CAPPED_KEY], "max_concurrency": 1},
        {"name": "open", "api_keys": [OPEN_KEY]},
    ]
    with picker_for(
        tmp_path_factory.mktemp("epp"),
        2,
        ("--fallbacks", "1"),
        routing={"policy": "cache_aware"},
        tenants=tenants,
    ) as started:
        yield started


async def test_buffered_pick_sets_header_and_metadata_alike_and_the_normalized_body(
    picker: Picker, channel: grpc.aio.Channel
) -> None:
    body = chat("What is a KV cache?", max_tokens=4, system="You are terse.   \n")
    envoy, answer = await buffered_pick(channel, body)
    headers = set_headers(answer, "request_body")
    endpoint, fallback = endpoints_of(answer)
    assert {endpoint, fallback} == set(picker.engines)
    assert answer.request_body.response.clear_route_cache
    forwarded = answer.request_body.response.body_mutation.body
    assert headers["content-length"] == str(len(forwarded)).encode()
    assert list(headers) == [DESTINATION, "content-length", LOAD_MARK_HEADER]
    assert parse_load_mark(headers[LOAD_MARK_HEADER].decode()) is not None, "the replica's reports acknowledge it"
    assert answer.request_body.response.header_mutation.remove_headers == ["authorization", "x-api-key"]
    sent = orjson.loads(forwarded)
    assert sent["messages"][0]["content"] == "You are terse."
    assert sent["max_tokens"] == 4 and sent["model"] == MODEL
    completion, added = await finish_whole(envoy, endpoint, forwarded)
    assert completion["usage"]["prompt_tokens"] > 0
    assert added["x-kvgate-backend"] == f"e{picker.engines.index(endpoint)}".encode()
    assert b"strip_message" in added["x-kvgate-normalized"].split(b",")
    wait_until(lambda: nothing_held(picker))
    assert picker.metric("kvgate_requests_total", tenant="open", status="200") >= 1


async def test_a_shared_prefix_goes_to_the_replica_that_holds_it(picker: Picker, channel: grpc.aio.Channel) -> None:
    system = " ".join(f"rule {index}: answer in plain words about topic {index * 7}." for index in range(60))
    body = chat("first question", max_tokens=2, system=system)
    envoy, first = await buffered_pick(channel, body)
    home = endpoints_of(first)[0]
    assert not first.request_body.response.HasField("body_mutation")
    await finish_whole(envoy, home, forwarded_body(first, body))
    for turn in range(3):
        body = chat(f"follow-up {turn}", max_tokens=2, system=system)
        envoy, answer = await buffered_pick(channel, body)
        assert endpoints_of(answer)[0] == home
        completion, added = await finish_whole(envoy, home, forwarded_body(answer, body))
        assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert added["x-kvgate-route-reason"] == b"prefix-hit"
    wait_until(lambda: nothing_held(picker))
    # The usage the response phase read reached the gateway's own metrics: reported and predicted hits.
    name = f"e{picker.engines.index(home)}"
    assert picker.metric("kvgate_cached_tokens_total", tenant="open", backend=name) > 0
    assert picker.metric("kvgate_predicted_cached_tokens_total", tenant="open", backend=name) > 0


async def test_a_request_the_fallback_served_is_credited_to_the_fallback_not_the_pick(
    picker: Picker, channel: grpc.aio.Channel
) -> None:
    system = " ".join(f"clause {index}: keep replies under {index + 3} words." for index in range(60))
    body = chat("first", max_tokens=2, system=system)
    envoy, answer = await buffered_pick(channel, body)
    primary, fallback = endpoints_of(answer)
    await finish_whole(envoy, fallback, forwarded_body(answer, body))
    wait_until(lambda: nothing_held(picker))
    body = chat("second", max_tokens=2, system=system)
    envoy, answer = await buffered_pick(channel, body)
    assert endpoints_of(answer)[0] == fallback, "the prompt's blocks are where the fallback computed them"
    _, added = await finish_whole(envoy, fallback, forwarded_body(answer, body))
    assert added["x-kvgate-route-reason"] == b"prefix-hit", (primary, added)
    wait_until(lambda: nothing_held(picker))


async def test_full_duplex_streamed_request_and_sse_response(picker: Picker, channel: grpc.aio.Channel) -> None:
    raw = orjson.dumps(
        chat("Stream me a short answer.", max_tokens=6, stream=True, stream_options={"include_usage": True})
    )
    envoy = EnvoySide(channel)
    await envoy.send(request_headers(raw, OPEN_KEY, request_mode=FULL_DUPLEX, response_mode=FULL_DUPLEX))
    third = len(raw) // 3
    await envoy.send(request_body(raw[:third], end_of_stream=False))
    await envoy.send(request_body(raw[third : 2 * third], end_of_stream=False))
    await envoy.send(request_body(raw[2 * third :], end_of_stream=True))
    headers_answer = await envoy.answer()
    assert headers_answer.HasField("request_headers")
    headers = set_headers(headers_answer, "request_headers")
    endpoint = endpoints_of(headers_answer, "request_headers")[0]
    body_answer = await envoy.answer()
    streamed = body_answer.request_body.response.body_mutation.streamed_response
    assert streamed.end_of_stream
    assert (streamed.body, list(headers)) == (raw, [DESTINATION, LOAD_MARK_HEADER])
    status, content_type, answer = forward(endpoint, streamed.body)
    assert status == 200 and content_type.startswith("text/event-stream")
    await envoy.send(response_headers(status, content_type, served=endpoint))
    assert (await envoy.answer()).HasField("response_headers")
    chunks = [answer[index : index + 37] for index in range(0, len(answer), 37)]
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        await envoy.send(response_body(chunk, end_of_stream=last))
        relayed = (await envoy.answer()).response_body.response.body_mutation.streamed_response
        assert (relayed.body, relayed.end_of_stream) == (chunk, last)
    await envoy.close()
    wait_until(lambda: nothing_held(picker))
    usage = json.loads([line for line in answer.decode().splitlines() if '"usage":{' in line][-1][6:])["usage"]
    assert usage["completion_tokens"] > 0


async def test_a_stream_cancelled_after_its_first_chunk_leaves_the_prompt_credited_to_its_replica(
    picker: Picker, channel: grpc.aio.Channel
) -> None:
    """Envoy cancels the stream when its client leaves mid-answer; the replica had prefilled the
    prompt and keeps its blocks, so the picker keeps them too: the next request on that prefix is
    a prefix hit there."""
    system = " ".join(f"article {index}: the lease runs {index + 2} years." for index in range(60))
    body = chat("stream it", max_tokens=6, stream=True, system=system)
    envoy, answer = await buffered_pick(channel, body)
    home = endpoints_of(answer)[0]
    status, content_type, streamed = forward(home, forwarded_body(answer, body))
    await envoy.send(response_headers(status, content_type, served=home))
    assert (await envoy.answer()).HasField("response_headers")
    first_event = streamed[: streamed.index(b"\n\n") + 2]
    await envoy.send(response_body(first_event, end_of_stream=False))
    await envoy.answer()
    envoy.cancel()
    wait_until(lambda: nothing_held(picker))
    body = chat("and again", max_tokens=2, system=system)
    envoy, again = await buffered_pick(channel, body)
    assert endpoints_of(again)[0] == home
    _, added = await finish_whole(envoy, home, forwarded_body(again, body))
    assert added["x-kvgate-route-reason"] == b"prefix-hit"
    wait_until(lambda: nothing_held(picker))


async def test_a_tenant_over_its_cap_gets_429_and_a_cancelled_stream_frees_its_slot(
    picker: Picker, channel: grpc.aio.Channel
) -> None:
    holder, answer = await buffered_pick(channel, chat("hold my slot", max_tokens=2), CAPPED_KEY)
    assert set_headers(answer, "request_body")[DESTINATION]
    assert picker.admin()["tenants_in_flight"]["capped"] == 1
    refused, immediate = await buffered_pick(channel, chat("one too many"), CAPPED_KEY, request_id="req-over-cap")
    expected = concurrency_exceeded("capped", 1, 1)
    assert immediate.immediate_response.status.code == 429
    assert immediate.immediate_response.body == orjson.dumps(expected.body())
    sent_headers = {o.header.key: o.header.raw_value for o in immediate.immediate_response.headers.set_headers}
    assert sent_headers["content-type"] == b"application/json"
    assert sent_headers["x-request-id"] == b"req-over-cap"
    refused.cancel()
    endpoint = endpoints_of(answer)[0]
    await holder.send(response_headers(200, "application/json", served=endpoint))
    await holder.answer()
    holder.cancel()
    wait_until(lambda: nothing_held(picker))
    assert picker.metric("kvgate_requests_total", tenant="capped", status="client_gone") >= 1
    assert picker.metric("kvgate_rejections_total", tenant="capped", status="429") >= 1
    again, answer = await buffered_pick(channel, chat("my slot is free again", max_tokens=2), CAPPED_KEY)
    assert set_headers(answer, "request_body")[DESTINATION]
    again.cancel()
    wait_until(lambda: nothing_held(picker))


async def test_a_stream_cancelled_before_the_pick_is_answered_holds_nothing(
    picker: Picker, channel: grpc.aio.Channel
) -> None:
    raw = orjson.dumps(chat("never finished", max_tokens=2))
    envoy = EnvoySide(channel)
    await envoy.send(request_headers(raw, CAPPED_KEY, request_mode=FULL_DUPLEX))
    await envoy.send(request_body(raw[:10], end_of_stream=False))
    envoy.cancel()
    wait_until(lambda: nothing_held(picker))
    again, answer = await buffered_pick(channel, chat("after the cancel", max_tokens=2), CAPPED_KEY)
    assert set_headers(answer, "request_body")[DESTINATION]
    again.cancel()
    wait_until(lambda: nothing_held(picker))


async def test_the_subset_hint_restricts_the_pick(picker: Picker, channel: grpc.aio.Channel) -> None:
    only = picker.engines[1]
    for index in range(4):
        envoy, answer = await buffered_pick(channel, chat(f"subset {index}", max_tokens=2), subset=[only])
        assert endpoints_of(answer) == [only]  # no fallback outside the subset either
        envoy.cancel()
    envoy, immediate = await buffered_pick(
        channel, chat("nowhere to go"), subset=["10.0.0.1:8000"], request_id="req-no-subset"
    )
    expected = service_unavailable(
        f"No healthy replica of '{MODEL}' is available among the 1 endpoints of the subset hint.", retry_after_s=1
    )
    assert immediate.immediate_response.status.code == 503
    assert immediate.immediate_response.body == orjson.dumps(expected.body())
    sent_headers = {o.header.key: o.header.raw_value for o in immediate.immediate_response.headers.set_headers}
    assert sent_headers == {
        "content-type": b"application/json",
        "retry-after": b"1",
        "x-request-id": b"req-no-subset",
    }
    envoy.cancel()
    wait_until(lambda: nothing_held(picker))


async def test_bad_input_is_an_openai_shaped_400(picker: Picker, channel: grpc.aio.Channel) -> None:
    envoy = EnvoySide(channel)
    raw = b'{"model": "smollm2-135m", "messages": ['
    await envoy.send(request_headers(raw, OPEN_KEY, request_mode=BUFFERED))
    await envoy.answer()
    await envoy.send(request_body(raw, end_of_stream=True))
    immediate = (await envoy.answer()).immediate_response
    assert immediate.status.code == 400
    assert orjson.loads(immediate.body)["error"]["type"] == "invalid_request_error"
    envoy.cancel()


async def test_a_body_mode_that_cannot_be_routed_on_is_refused_by_name(channel: grpc.aio.Channel) -> None:
    raw = orjson.dumps(chat("streamed too early"))
    envoy = EnvoySide(channel)
    await envoy.send(request_headers(raw, OPEN_KEY, request_mode=STREAMED))
    immediate = (await envoy.answer()).immediate_response
    assert immediate.status.code == 500
    error = orjson.loads(immediate.body)["error"]
    assert error["code"] == "epp_body_mode" and "STREAMED" in error["message"]
    envoy.cancel()


@pytest.mark.parametrize("service", ["", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"])
async def test_health_answers_serving_on_both_ports(picker: Picker, service: str) -> None:
    for target in (picker.health_target, picker.grpc_target):
        async with grpc.aio.insecure_channel(target) as health_channel:
            stub = health_pb2_grpc.HealthStub(health_channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_kvgate_lists_the_epp_command() -> None:
    reply = asyncio.run(_help())
    assert "--grpc-port" in reply and "--health-port" in reply


async def _help() -> str:
    process = await asyncio.create_subprocess_exec(
        *kvgate_cmd("epp", "--help"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    return output.decode()
