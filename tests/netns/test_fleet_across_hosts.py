"""Two gateways, an engine, Redis and a client on five separate hosts (network namespaces on one bridge).

The gateways share a tenant cap through Redis on another host and proxy to an engine on a third:
nothing of the fleet relies on loopback.
"""

import subprocess
import sys
from pathlib import Path

import orjson
import yaml

from bench.harness.processes import REPO, Process, launch
from tests.gateway_cluster import MODEL, SLOW_SIM, chat
from tests.netns.lan import Host, lan, require_netns
from tests.redis_server import RedisServer, require_redis

ENGINE_PORT, GATEWAY_PORT, REDIS_PORT, KV_EVENTS_PORT = 8100, 8000, 6379, 5557
"""Each host has its own port space, so fixed ports cannot collide."""
CAP = 2


def start_engine(host: Host, tmp_path: Path) -> Process:
    command = host.command(sys.executable, "-m", "gateway.process.cli", "engine", "--host", host.address)
    flags = ["--port", str(ENGINE_PORT), "--kv-events", f"tcp://{host.address}:{KV_EVENTS_PORT}", *SLOW_SIM]
    return launch([*command, *flags], ENGINE_PORT, tmp_path / "engine.log")


def start_gateway(host: Host, engine: Host, redis: RedisServer, tmp_path: Path) -> Process:
    config = {
        "listen": {"host": host.address, "port": GATEWAY_PORT},
        "model": MODEL,
        "backends": [
            {
                "name": "remote",
                "url": f"http://{engine.address}:{ENGINE_PORT}",
                "kv_events": f"tcp://{engine.address}:{KV_EVENTS_PORT}",
            }
        ],
        "health": {"interval_s": 0.5},
        "tenants": [
            {"name": "capped", "api_keys": ["key-capped"], "max_concurrency": CAP},
            {"name": "free", "api_keys": ["key-free"]},
        ],
        "shared_state": {"redis_url": redis.url, "lease_s": 2},
    }
    path = tmp_path / f"{host.namespace}.yaml"
    path.write_text(yaml.safe_dump(config))
    command = host.command(sys.executable, "-m", "gateway.process.cli", "gateway", "-c", str(path))
    return launch(command, GATEWAY_PORT, tmp_path / f"{host.namespace}.log")


def run_client(client: Host, spec: dict) -> list[dict]:
    command = client.command(sys.executable, "-m", "tests.netns.client", orjson.dumps(spec).decode())
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return orjson.loads(done.stdout.strip().splitlines()[-1])


def test_gateways_engine_and_redis_on_separate_hosts_share_a_tenant_cap(tmp_path: Path) -> None:
    require_redis()
    require_netns()
    with lan(["redis", "engine", "gw0", "gw1", "client"]) as hosts:
        redis = RedisServer(tmp_path, host=hosts["redis"].address, port=REDIS_PORT, prefix=hosts["redis"].command())
        processes: list[Process] = []
        try:
            redis.start()
            processes.append(start_engine(hosts["engine"], tmp_path))
            gateways = [hosts["gw0"], hosts["gw1"]]
            processes += [start_gateway(gateway, hosts["engine"], redis, tmp_path) for gateway in gateways]
            urls = [f"http://{gateway.address}:{GATEWAY_PORT}" for gateway in gateways]
            capped = [
                {"url": urls[index % 2], "key": "key-capped", "body": chat("hold", 100, ignore_eos=True)}
                for index in range(6)
            ]
            free = [{"url": url, "key": "key-free", "body": chat("hello", 2)} for url in urls]
            results = run_client(hosts["client"], {"ready": urls, "requests": capped + free})
        finally:
            for process in processes:
                process.stop()
            redis.stop()
    logs = "\n".join(path.read_text(errors="replace")[-2000:] for path in tmp_path.glob("*.log"))
    admitted = [result for result in results[:6] if result["status"] == 200]
    assert len(admitted) == CAP, (results, logs)
    assert {result["code"] for result in results[:6] if result["status"] != 200} == {"concurrency_limit_exceeded"}
    assert [result["status"] for result in results[6:]] == [200, 200]
    assert {result["backend"] for result in admitted + results[6:]} == {"remote"}
