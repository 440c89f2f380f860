"""deploy/: every kvgate flag and config key the Dockerfile, docker-compose and Kubernetes files use is one kvgate accepts.

Commands go through the real argument parsers, configs through the real config schema; the
files are also checked against each other (names, ports, replica counts). Building the image and
running the stacks needs Docker and a cluster, which the test machine does not have.
"""

import argparse
import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from engine.cli import build_parser as engine_parser
from engine.cli import config_from_args
from gateway.config import KvgateConfig, parse_config
from gateway.process.server import build_parser as gateway_parser
from gateway.process.supervisor import build_parser as up_parser
from tests.procs import REPO

DEPLOY = REPO / "deploy"
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "engine": engine_parser,
    "gateway": gateway_parser,
    "up": up_parser,
}
SECRETS = {"KVGATE_DEMO_KEY": "demo-key", "KVGATE_ADMIN_KEY": "admin-key"}


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def kvgate_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``kvgate ARGV`` as kvgate does; fail the test with argparse's message otherwise."""
    command, *rest = argv
    assert command in PARSERS, f"unknown kvgate command {command!r}"
    try:
        args = PARSERS[command]().parse_args(rest)
    except SystemExit:
        pytest.fail(f"kvgate refuses: kvgate {' '.join(argv)}")
    if command == "engine":
        config_from_args(args)
    return args


def kvgate_config(text: str, source: str) -> KvgateConfig:
    return parse_config(yaml.safe_load(text), source)


def env_references(text: str) -> set[str]:
    return set(re.findall(r"\$\{ENV:([A-Za-z_][A-Za-z0-9_]*)\}", text))


def port_of(endpoint: str) -> int:
    port = urlsplit(endpoint).port
    assert port is not None, endpoint
    return port


def engine_ports(args: argparse.Namespace) -> tuple[int, int]:
    """The HTTP port and the KV-events port an engine's flags bind."""
    assert args.host == "0.0.0.0" and args.kv_events, "a containerised engine listens on every address"
    return args.port, int(args.kv_events.rsplit(":", 1)[1])


def test_dockerfile_installs_every_package_and_runs_kvgate() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    instructions = [line.split(None, 1) for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    entrypoint = [json.loads(rest) for word, rest in instructions if word == "ENTRYPOINT"][-1]
    command = [json.loads(rest) for word, rest in instructions if word == "CMD"][-1]
    assert entrypoint == ["kvgate"]
    engine_ports(kvgate_args(command))
    copied = {rest.split()[0] for word, rest in instructions if word == "COPY"}
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {package.rstrip("*") for package in packages} <= copied
    assert "download.pytorch.org/whl/cpu" in text and 'torch==2.13.0"' in text


def test_compose_runs_three_gateways_two_engines_and_redis_with_accepted_flags_and_config() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    services = compose["services"]
    gateways = {name: service for name, service in services.items() if service.get("command", [""])[0] == "gateway"}
    engines = {name: service for name, service in services.items() if service.get("command", [""])[0] == "engine"}
    assert len(gateways) == 3 and len(engines) == 2 and "redis" in services
    ports = {name: engine_ports(kvgate_args(service["command"])) for name, service in engines.items()}
    for name, service in gateways.items():
        args = kvgate_args(service["command"])
        host_path, mounted = next(volume.split(":")[:2] for volume in service["volumes"])
        assert mounted == args.config, f"{name} reads the file it mounts"
        text = (DEPLOY / host_path).read_text()
        config = kvgate_config(text, host_path)
        assert env_references(text) <= set(service["environment"])
        assert {
            backend.name: (port_of(backend.url), port_of(backend.kv_events or "")) for backend in config.backends
        } == ports
        assert all(urlsplit(backend.url).hostname == backend.name for backend in config.backends)
        assert config.shared_state is not None and urlsplit(config.shared_state.redis_url).hostname == "redis"
        assert config.listen.host == "0.0.0.0" and {f"{8000 + index}:8000" for index in range(3)} >= set(
            service["ports"]
        )


def k8s(name: str) -> dict[str, list[dict[str, Any]]]:
    """The documents of deploy/k8s/NAME by kind."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for document in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()):
        by_kind.setdefault(document["kind"], []).append(document)
    return by_kind


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def test_kubernetes_gateways_engines_and_redis_agree_with_each_other_and_with_kvgate() -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == ["engine.yaml", "gateway.yaml", "redis.yaml"]
    gateway, engine, redis = k8s("gateway.yaml"), k8s("engine.yaml"), k8s("redis.yaml")

    (statefulset,) = engine["StatefulSet"]
    (headless,) = engine["Service"]
    assert (
        headless["spec"]["clusterIP"] == "None" and headless["metadata"]["name"] == statefulset["spec"]["serviceName"]
    )
    http_port, events_port = engine_ports(kvgate_args(container(statefulset)["args"]))
    pods = [
        f"{statefulset['metadata']['name']}-{index}.{headless['metadata']['name']}"
        for index in range(statefulset["spec"]["replicas"])
    ]

    (deployment,) = gateway["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    gateway_container = container(deployment)
    args = kvgate_args(gateway_container["args"])
    (config_map,) = gateway["ConfigMap"]
    (mount,) = gateway_container["volumeMounts"]
    assert Path(args.config).parent == Path(mount["mountPath"])
    text = config_map["data"][Path(args.config).name]
    config = kvgate_config(text, "deploy/k8s/gateway.yaml")
    assert env_references(text) <= {variable["name"] for variable in gateway_container["env"]}
    assert [urlsplit(backend.url).hostname for backend in config.backends] == pods
    assert all(
        port_of(backend.url) == http_port and port_of(backend.kv_events or "") == events_port
        for backend in config.backends
    )

    (redis_service,) = redis["Service"]
    assert config.shared_state is not None
    redis_url = urlsplit(config.shared_state.redis_url)
    assert (redis_url.hostname, redis_url.port) == (
        redis_service["metadata"]["name"],
        redis_service["spec"]["ports"][0]["port"],
    )
    (service,) = gateway["Service"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
