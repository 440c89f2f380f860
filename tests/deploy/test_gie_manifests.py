"""deploy/gie/ and deploy/autoscaling/: the GIE manifests validate against their vendored CRDs'
openAPIV3Schema (``jsonschema``), and agree with the engines, the picker's flags and its config.

No cluster runs here, so the CEL rules of the CRDs (``x-kubernetes-validations``) are not
evaluated; those that bear on these manifests are asserted by hand below.
"""

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from engine.cli import build_parser as engine_parser
from gateway.config import parse_config
from gateway.epp.server import build_parser as epp_parser
from tests.procs import REPO

DEPLOY = REPO / "deploy"
GIE = DEPLOY / "gie"
CRDS = GIE / "crds"
Document = dict[str, Any]


def documents(path: Path) -> list[Document]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def strict(schema: Any) -> Any:
    """A Kubernetes structural schema as JSON Schema: ``nullable`` and ``x-kubernetes-int-or-string``
    spelled out, and unknown fields refused (the API server prunes them; ``kubectl --validate=strict``
    refuses them), except under ``x-kubernetes-preserve-unknown-fields``."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: strict(value) for key, value in schema.items()}
    if "properties" in schema:
        converted["properties"] = {name: strict(value) for name, value in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            converted["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string"):
        converted.pop("type", None)
        converted["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in converted:
        converted["type"] = [converted["type"], "null"]
    return converted


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the JSON Schema of each served version of each vendored CRD."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        (crd,) = documents(path)
        assert crd["kind"] == "CustomResourceDefinition"
        spec = crd["spec"]
        for version in spec["versions"]:
            if version["served"]:
                schema = strict(version["schema"]["openAPIV3Schema"])
                schemas[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = schema
    return schemas


SCHEMAS = crd_schemas()


def validate(document: Document) -> None:
    schema = SCHEMAS[(document["apiVersion"], document["kind"])]
    jsonschema.Draft7Validator(schema).validate(document)


def by_kind(*paths: Path) -> dict[str, list[Document]]:
    found: dict[str, list[Document]] = {}
    for path in paths:
        for document in documents(path):
            found.setdefault(document["kind"], []).append(document)
    return found


def test_the_vendored_crds_are_the_versions_the_readme_names() -> None:
    readme = (CRDS / "README.md").read_text()
    (pool,) = documents(CRDS / "inference.networking.k8s.io_inferencepools.yaml")
    (route,) = documents(CRDS / "gateway.networking.k8s.io_httproutes.yaml")
    pool_version = pool["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"]
    route_version = route["metadata"]["annotations"]["gateway.networking.k8s.io/bundle-version"]
    assert f"Gateway API Inference Extension {pool_version}" in readme and f"Gateway API {route_version}" in readme
    assert route["metadata"]["annotations"]["gateway.networking.k8s.io/channel"] == "standard"
    assert "Apache License, Version 2.0" in readme
    assert {("inference.networking.k8s.io/v1", "InferencePool"), ("gateway.networking.k8s.io/v1", "HTTPRoute")} <= set(
        SCHEMAS
    )


@pytest.mark.parametrize("name", ["inferencepool.yaml", "httproute.yaml"])
def test_each_custom_resource_validates_against_its_crd(name: str) -> None:
    for document in documents(GIE / name):
        validate(document)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "targetPorts"), [{"numbr": 8100}]),
        (("spec", "targetPorts"), [{"number": 70000}]),
        (("spec", "endpointPickerRef", "failureMode"), "FailSometimes"),
        (("spec", "selector"), {"matchLabels": {}}),
        (("spec", "extra"), True),
    ],
)
def test_the_check_refuses_a_pool_the_api_server_would(path: tuple[str, ...], value: Any) -> None:
    (pool,) = documents(GIE / "inferencepool.yaml")
    target = pool
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)


def test_the_pool_selects_the_engines_and_picks_through_the_epp_service() -> None:
    gie = by_kind(GIE / "inferencepool.yaml", GIE / "epp.yaml", GIE / "httproute.yaml")
    engine = by_kind(DEPLOY / "k8s" / "engine.yaml")
    (pool,), (statefulset,) = gie["InferencePool"], engine["StatefulSet"]
    spec = pool["spec"]
    assert spec["selector"]["matchLabels"].items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()
    (engine_container,) = statefulset["spec"]["template"]["spec"]["containers"]
    engine_args = engine_parser().parse_args(engine_container["args"][1:])
    assert [port["number"] for port in spec["targetPorts"]] == [engine_args.port]

    picker_ref = spec["endpointPickerRef"]
    assert picker_ref.get("kind", "Service") != "Service" or "port" in picker_ref, "CEL: a Service ref has a port"
    (service,) = gie["Service"]
    assert picker_ref["name"] == service["metadata"]["name"]
    service_ports = {port["name"]: port for port in service["spec"]["ports"]}
    assert {name: port["port"] for name, port in service_ports.items()} == {
        "grpc": 9002,
        "grpc-health": 9003,
        "metrics": 9090,
    }
    assert picker_ref["port"]["number"] == service_ports["grpc"]["port"]
    assert service_ports["grpc"]["appProtocol"] == "http2", "ext_proc is gRPC: HTTP/2 to the picker"

    (route,) = gie["HTTPRoute"]
    refs = [ref for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    assert refs == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["metadata"]["name"]}]


def test_the_epp_runs_kvgate_epp_on_gies_ports_with_the_config_it_mounts() -> None:
    gie = by_kind(GIE / "epp.yaml")
    (deployment,), (config_map,), (service,) = gie["Deployment"], gie["ConfigMap"], gie["Service"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command, *flags = container["args"]
    assert command == "epp"
    args = epp_parser().parse_args(flags)
    assert (args.grpc_port, args.health_port, args.metrics_port) == (9002, 9003, 9090)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": args.grpc_port, "grpc-health": args.health_port, "metrics": args.metrics_port}
    targets = {port["targetPort"] for port in service["spec"]["ports"]}
    assert targets == set(ports)
    for probe in (container["livenessProbe"], container["readinessProbe"]):
        assert probe["grpc"]["port"] == args.health_port
    assert {container["livenessProbe"]["grpc"]["service"], container["readinessProbe"]["grpc"]["service"]} == {
        "liveness",
        "readiness",
    }, "the health services kvgate epp serves"
    (mount,) = container["volumeMounts"]
    assert Path(args.config).parent == Path(mount["mountPath"])
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["name"] == mount["name"] and volume["configMap"]["name"] == config_map["metadata"]["name"]
    config = parse_config(yaml.safe_load(config_map["data"][Path(args.config).name]), "deploy/gie/epp.yaml")
    (statefulset,) = by_kind(DEPLOY / "k8s" / "engine.yaml")["StatefulSet"]
    (engine_container,) = statefulset["spec"]["template"]["spec"]["containers"]
    engine_args = engine_parser().parse_args(engine_container["args"][1:])
    assert config.backends == [], "the replicas are the pool's pods, by IP, as Envoy needs them"
    (rule,) = config.discovery.kubernetes
    (pool,) = by_kind(GIE / "inferencepool.yaml")["InferencePool"]
    assert rule.inference_pool == pool["metadata"]["name"] and rule.kubeconfig is None, "in cluster"
    assert [port["number"] for port in pool["spec"]["targetPorts"]] == [engine_args.port]
    sockets = (rule.kv_events_port, rule.kv_events_replay_port, rule.load_events_port)
    flags = (engine_args.kv_events, engine_args.kv_events_replay, engine_args.load_events)
    assert sockets == tuple(int(flag.rsplit(":", 1)[1]) for flag in flags)


def test_the_kustomization_lists_every_manifest() -> None:
    (kustomization,) = documents(GIE / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == ["epp.yaml", "httproute.yaml", "inferencepool.yaml", "rbac.yaml"]


def test_autoscalers_scale_the_engines_on_pool_saturation() -> None:
    (statefulset,) = by_kind(DEPLOY / "k8s" / "engine.yaml")["StatefulSet"]
    target = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": statefulset["metadata"]["name"]}
    (scaled,) = documents(DEPLOY / "autoscaling" / "keda-scaledobject.yaml")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"] == target
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    assert "kvgate_pool_saturation{" in trigger["metadata"]["query"]
    assert 0 < float(trigger["metadata"]["threshold"]) < 1
    (hpa,) = documents(DEPLOY / "autoscaling" / "hpa.yaml")
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["spec"]["scaleTargetRef"] == target
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == "kvgate_pool_saturation"
    assert metric["external"]["target"]["type"] == "Value"
