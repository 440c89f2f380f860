"""DNS discovery (``discovery.dns``) against a real resolver: dnsmasq on loopback serving the A records
of a hosts file this test rewrites (and signals dnsmasq with SIGHUP to re-read). Replicas are real
simulated engines on 127.0.0.2 and 127.0.0.3, all on the same ports, as a StatefulSet's pods are; the
gateway must follow the records without a restart, route to what it finds, and drop a gone replica's
prefix-index entries."""

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import dns.exception
import dns.resolver
import pytest

from gateway.backends.discovery_config import DnsDiscovery
from gateway.backends.dns_discovery import backend_for
from gateway.config import ConfigError, parse_config
from tests.discovered_fleet import (
    MODEL,
    complete,
    engines_on,
    fleet_ports,
    healthy_backends,
    indexed_backends,
    rule_ports,
    start_discovering_gateway,
    wait_for,
)
from tests.procs import ManagedProcess, free_port, http

HOST = "engines.kvgate.test"
ADDRESSES = ("127.0.0.2", "127.0.0.3")
INTERVAL_S = 0.3
LOOKUP_TIMEOUT_S = 0.5
"""dnsmasq answers in well under a millisecond; a stopped one fails a lookup after this."""
DNSMASQ = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"


def test_a_rule_derives_each_replicas_url_and_sockets_from_its_address() -> None:
    rule = DnsDiscovery(
        name="engine", host="engine.ns.svc", port=8100, kv_events_port=5557, kv_events_replay_port=5558,
        load_events_port=5559,
    )  # fmt: skip
    backend = backend_for(rule, "10.1.2.3")
    assert backend.name == "engine-10.1.2.3" and backend.url == "http://10.1.2.3:8100"
    assert (backend.kv_events, backend.kv_events_replay, backend.load_events) == (
        "tcp://10.1.2.3:5557",
        "tcp://10.1.2.3:5558",
        "tcp://10.1.2.3:5559",
    )
    bare = backend_for(DnsDiscovery(name="e", host="h", port=80), "10.0.0.1")
    assert bare.kv_events is None and bare.load_events is None and bare.model is None and bare.role == "both"
    assert backend_for(DnsDiscovery(name="p", host="h", port=80, role="prefill"), "10.0.0.2").role == "prefill"


def test_a_rule_must_serve_a_known_model_and_names_are_unique() -> None:
    rule = {"name": "e", "host": "h", "port": 80}
    with pytest.raises(ConfigError, match="model must be"):
        parse_config({"discovery": {"dns": [{**rule, "model": "nobody-serves-this"}]}}, "test")
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"discovery": {"dns": [rule, rule]}}, "test")
    with pytest.raises(ConfigError, match="port"):
        parse_config({"discovery": {"dns": [{**rule, "port": 0}]}}, "test")


class Dnsmasq:
    """dnsmasq on 127.0.0.1:port answering only from ``hosts`` (no upstream, no /etc/hosts, TTL 0); a name
    of ``kvgate.test`` it does not list is NXDOMAIN, as cluster DNS answers for a Service with no pod."""

    def __init__(self, folder: Path) -> None:
        self.hosts = folder / "hosts"
        self.port = free_port()
        self.set_addresses([])
        self.log = folder / "dnsmasq.log"
        command = [
            DNSMASQ, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--local=/kvgate.test/",
            f"--addn-hosts={self.hosts}", "--listen-address=127.0.0.1", "--bind-interfaces",
            f"--port={self.port}", "--user=root", "--pid-file=", "--log-facility=-", "--log-queries",
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.answers, "dnsmasq to answer")

    def answers(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port = ["127.0.0.1"], self.port
        try:
            resolver.resolve(HOST, "A", lifetime=1.0)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return True
        except dns.exception.Timeout:
            return False
        return True

    def set_addresses(self, addresses: tuple[str, ...] | list[str]) -> None:
        """Rewrite the hosts file (atomically) and have dnsmasq re-read it."""
        staged = self.hosts.with_suffix(".new")
        staged.write_text("".join(f"{address} {HOST}\n" for address in addresses))
        os.replace(staged, self.hosts)
        if hasattr(self, "proc"):
            self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return fleet_ports()


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, ports: dict[str, int]) -> Iterator[list[ManagedProcess]]:
    with engines_on(ADDRESSES, ports, tmp_path_factory.mktemp("dns-engines")) as started:
        yield started


@pytest.fixture
def dnsmasq(tmp_path: Path) -> Iterator[Dnsmasq]:
    if not Path(DNSMASQ).is_file():
        pytest.skip("dnsmasq is not installed (`make test` installs dnsmasq-base where apt-get can)")
    server = Dnsmasq(tmp_path)
    yield server
    server.stop()


def start_dns_gateway(tmp_path: Path, dnsmasq: Dnsmasq, ports: dict[str, int]) -> ManagedProcess:
    rule = {
        "name": "engine",
        "host": HOST,
        "port": ports["http"],
        **rule_ports(ports),
        "interval_s": INTERVAL_S,
        "lookup_timeout_s": LOOKUP_TIMEOUT_S,
        "nameserver": f"127.0.0.1:{dnsmasq.port}",
    }
    return start_discovering_gateway(tmp_path, {"dns": [rule]})


def name(address: str) -> str:
    return f"engine-{address}"


def test_routing_follows_the_a_records_as_replicas_come_and_go(
    tmp_path: Path, engines: list[ManagedProcess], dnsmasq: Dnsmasq, ports: dict[str, int]
) -> None:
    first, second = ADDRESSES
    dnsmasq.set_addresses([first])
    gateway = start_dns_gateway(tmp_path, dnsmasq, ports)
    try:
        assert healthy_backends(gateway) == {name(first)}, "the first lookup runs before the gateway serves"
        assert {complete(gateway, seed) for seed in range(4)} == {name(first)}

        dnsmasq.set_addresses([first, second])
        wait_for(lambda: healthy_backends(gateway) == {name(first), name(second)}, "the new A record to join")
        served = {complete(gateway, seed) for seed in range(10, 40)}
        assert served == {name(first), name(second)}, "new prompts spread over both replicas"
        wait_for(lambda: indexed_backends(gateway) == {name(first), name(second)}, "KV events from both")

        dnsmasq.set_addresses([second])
        wait_for(lambda: healthy_backends(gateway) == {name(second)}, "the gone A record to leave")
        wait_for(lambda: indexed_backends(gateway) == {name(second)}, "its prefix-index entries to be dropped")
        assert {complete(gateway, seed) for seed in range(4)} == {name(second)}, "even prompts it had cached"

        dnsmasq.set_addresses([])
        wait_for(lambda: healthy_backends(gateway) == set(), "no A record: no replica")
        reply = http("POST", f"{gateway.url}/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert reply.status == 503
    finally:
        gateway.stop()


def test_a_resolver_that_stops_answering_keeps_the_last_replicas(
    tmp_path: Path, engines: list[ManagedProcess], dnsmasq: Dnsmasq, ports: dict[str, int]
) -> None:
    dnsmasq.set_addresses(list(ADDRESSES))
    gateway = start_dns_gateway(tmp_path, dnsmasq, ports)
    try:
        assert healthy_backends(gateway) == {name(address) for address in ADDRESSES}
        dnsmasq.stop()
        wait_for(lambda: gateway.log().count("keeping the last answer") >= 2, "two failed lookups")
        assert healthy_backends(gateway) == {name(address) for address in ADDRESSES}
    finally:
        gateway.stop()
