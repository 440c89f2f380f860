"""Kubernetes discovery's rules over API objects (gateway/backends/k8s_pool.py) and its config
(``discovery.kubernetes``): which pods are replicas, and the backends an InferencePool makes."""

import pytest

from gateway.backends.discovery_config import KubernetesDiscovery
from gateway.backends.k8s_pool import PoolSpec, backends_for, pool_spec, ready_address
from gateway.config import ConfigError, parse_config
from tests.backends.fake_kube_api import inference_pool, pod

RULE = {"name": "engine", "inference_pool": "kvgate-pool"}


def test_a_pool_spec_is_its_match_labels_and_target_ports() -> None:
    spec = pool_spec(inference_pool("p", {"app.kubernetes.io/name": "engine", "tier": "a"}, [8100, 8200]))
    assert spec == PoolSpec((("app.kubernetes.io/name", "engine"), ("tier", "a")), (8100, 8200))
    assert spec.label_selector == "app.kubernetes.io/name=engine,tier=a"
    assert pool_spec({"metadata": {"name": "p"}, "spec": {"targetPorts": [{"number": 1}]}}) is None
    assert pool_spec({"metadata": {"name": "p"}}) is None


def test_a_pod_is_a_replica_while_it_has_an_ip_is_ready_and_is_not_being_deleted() -> None:
    labels = {"app": "engine"}
    assert ready_address(pod("a", "10.1.0.5", labels)) == "10.1.0.5"
    assert ready_address(pod("a", "10.1.0.5", labels, ready=False)) is None
    assert ready_address(pod("a", None, labels)) is None, "scheduled, no IP yet"
    deleting = pod("a", "10.1.0.5", labels)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:01:00Z"
    assert ready_address(deleting) is None, "terminating pods leave at once, as GIE's picker drops them"
    assert ready_address({"metadata": {"name": "bare"}}) is None


def test_each_ready_pod_and_target_port_is_a_backend_with_its_ranks_socket_ports() -> None:
    rule = KubernetesDiscovery(**RULE, kv_events_port=5557, kv_events_replay_port=5567, load_events_port=5577)
    (one,) = backends_for(rule, PoolSpec((("app", "e"),), (8100,)), ["10.1.0.5", "10.1.0.5"])
    assert (one.name, one.url, one.kv_events, one.kv_events_replay, one.load_events) == (
        "engine-10.1.0.5",
        "http://10.1.0.5:8100",
        "tcp://10.1.0.5:5557",
        "tcp://10.1.0.5:5567",
        "tcp://10.1.0.5:5577",
    )
    ranks = backends_for(rule, PoolSpec((("app", "e"),), (8000, 8001)), ["10.1.0.6", "10.1.0.5"])
    assert [(backend.name, backend.url, backend.kv_events) for backend in ranks] == [
        ("engine-10.1.0.5-8000", "http://10.1.0.5:8000", "tcp://10.1.0.5:5557"),
        ("engine-10.1.0.5-8001", "http://10.1.0.5:8001", "tcp://10.1.0.5:5558"),
        ("engine-10.1.0.6-8000", "http://10.1.0.6:8000", "tcp://10.1.0.6:5557"),
        ("engine-10.1.0.6-8001", "http://10.1.0.6:8001", "tcp://10.1.0.6:5558"),
    ], "rank i's sockets are the ports + i, as vLLM offsets them by data-parallel rank"
    (v6,) = backends_for(KubernetesDiscovery(**RULE), PoolSpec((("app", "e"),), (8100,)), ["fd00::5"])
    assert (v6.url, v6.kv_events, v6.role) == ("http://[fd00::5]:8100", None, "both")
    (decode,) = backends_for(
        KubernetesDiscovery(**RULE, role="decode"), PoolSpec((("app", "e"),), (8100,)), ["10.1.0.7"]
    )
    assert decode.role == "decode", "a pool of decode pods: every pod it selects decodes"


def test_the_config_refuses_bad_rules_with_a_clear_message() -> None:
    def refused(rules: list[dict], match: str, **extra: object) -> None:
        with pytest.raises(ConfigError, match=match):
            parse_config({"discovery": {"kubernetes": rules}, **extra}, "test")

    refused([{**RULE, "inference_pool": "Not_A_Name"}], "inference_pool")
    refused([{**RULE, "namespace": "bad namespace"}], "namespace")
    refused([{**RULE, "context": "prod"}], "context names a kubeconfig context: set kubeconfig too")
    refused([{**RULE, "selector": {"app": "x"}}], "selector")
    refused([{**RULE, "model": "nobody-serves-this"}], "model must be")
    refused([{"name": "inference_pool"}], "inference_pool")
    with pytest.raises(ConfigError, match="unique across dns and kubernetes"):
        parse_config({"discovery": {"kubernetes": [RULE], "dns": [{"name": "engine", "host": "h", "port": 80}]}}, "t")
    shared = {"shared_state": {"redis_url": "redis://127.0.0.1:6379"}}
    refused([RULE], "need kv_events_port on discovery engine", **shared)
    config = parse_config(
        {"discovery": {"kubernetes": [{**RULE, "kubeconfig": "~/.kube/config", "context": "c"}]}}, "t"
    )
    assert config.discovery.kubernetes[0].namespace is None
