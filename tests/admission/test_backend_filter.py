"""The routing pipeline's filter stage: the backend pool keeps the replicas that may take a request."""

from gateway.backends.pool import BackendPool
from gateway.config import BackendSpec, HealthConfig


def pool_of(*names: str, model: str = "m") -> BackendPool:
    specs = [(BackendSpec(name=name, url=f"http://127.0.0.1:{9000 + i}"), model) for i, name in enumerate(names)]
    pool = BackendPool.from_specs(specs, HealthConfig(eject_after_failures=1))
    for backend in pool.backends.values():
        backend.healthy = True
    return pool


def test_usable_drops_other_models_unhealthy_draining_and_open_breakers() -> None:
    pool = pool_of("ok", "sick", "leaving", "broken")
    pool.backends["sick"].healthy = False
    pool.backends["leaving"].removed = True
    pool.backends["broken"].breaker.record_failure()
    assert [backend.name for backend in pool.usable("m")] == ["ok"]
    assert pool.usable("other-model") == []


def test_a_full_replica_is_usable_but_has_no_room() -> None:
    pool = BackendPool.from_specs(
        [(BackendSpec(name="a", url="http://127.0.0.1:9000", max_concurrency=1), "m")], HealthConfig()
    )
    backend = pool.backends["a"]
    backend.healthy = True
    backend.in_flight = 1
    assert pool.usable("m") == [backend] and not backend.has_room
