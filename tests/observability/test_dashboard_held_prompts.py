"""The dashboard's replica rows show, of the engine's queue, the prompts held behind a prefix being
computed (``held_prefill_tokens``): the part a request that does not share the prefix passes."""

from protocol.replica_stats import PrefixWait, ReplicaLoad
from radix.hashing import hash_to_bytes
from tests.gateway.fake_replica import FakeReplica, gateway, gateway_config, replicas, state


async def test_a_replicas_row_shows_its_held_prompts_beside_its_queue() -> None:
    async with replicas(FakeReplica(), FakeReplica()) as urls, gateway(gateway_config(urls), None) as client:
        backend = state(client).pool.backends["a"]
        held = [PrefixWait(hash_to_bytes(1 << 90), 6_000, 3), PrefixWait(hash_to_bytes(2 << 90), 1_500, 1)]
        backend.load.on_report(
            ReplicaLoad(ts=0.0, running=1, waiting=4, queued_prefill_tokens=9_000, prefix_waits=held)
        )
        stats = await (await client.get("/dashboard/stats.json")).json()
        rows = {row["name"]: row for row in stats["replicas"]}
        assert (rows["a"]["queued_prefill_tokens"], rows["a"]["held_prefill_tokens"]) == (9_000, 7_500)
        assert rows["b"]["held_prefill_tokens"] == 0
