"""DNS discovery (``discovery.dns``): a rule's replicas are the A records of its host, looked up
every ``interval_s``; the gateway's backend set follows them without a restart.

Each change hands the whole discovered set to ``on_change`` (the gateway applies it as a reload
applies a config: a new address joins once its health check passes, a gone one drains, and the
router forgets its prefix-index entries). A name with no A record means no replica (a headless
Service with no ready pod); a failed lookup (timeout, server failure) keeps the last answer, so a
resolver hiccup never empties the pool.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

import dns.asyncresolver
import dns.exception
import dns.resolver

from gateway.backends.discovery_config import DnsDiscovery
from gateway.config import BackendSpec

log = logging.getLogger("kvgate.discovery")

NO_RECORD = (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer)


def backend_for(rule: DnsDiscovery, address: str) -> BackendSpec:
    """The backend at ``address``: its name, URL and sockets by the rule's ports."""

    def socket(port: int | None) -> str | None:
        return f"tcp://{address}:{port}" if port is not None else None

    return BackendSpec(
        name=f"{rule.name}-{address}",
        url=f"http://{address}:{rule.port}",
        model=rule.model,
        kv_events=socket(rule.kv_events_port),
        kv_events_replay=socket(rule.kv_events_replay_port),
        load_events=socket(rule.load_events_port),
        max_concurrency=rule.max_concurrency,
        role=rule.role,
    )


def resolver_for(rule: DnsDiscovery) -> dns.asyncresolver.Resolver:
    if rule.nameserver is None:
        return dns.asyncresolver.Resolver()
    resolver = dns.asyncresolver.Resolver(configure=False)
    address, _, port = rule.nameserver.partition(":")
    resolver.nameservers = [address]
    resolver.port = int(port) if port else 53
    return resolver


async def lookup(rule: DnsDiscovery, resolver: dns.asyncresolver.Resolver) -> list[str] | None:
    """The host's IPv4 addresses, sorted; [] when it has none; None when the lookup failed. A relative
    name goes through the resolver's search domains, as a pod's own lookups do (``engine`` finds the
    Service ``engine`` of the pod's namespace)."""
    try:
        answer = await resolver.resolve(rule.host, "A", lifetime=rule.lookup_timeout_s, search=True)
    except NO_RECORD:
        return []
    except dns.exception.DNSException as exc:
        log.warning("discovery.dns %s: looking up %s failed, keeping the last answer: %s", rule.name, rule.host, exc)
        return None
    return sorted({record.address for record in answer})


class DnsDiscoverer:
    """Follows every ``discovery.dns`` rule, one task each; ``backends`` is what they found last."""

    def __init__(self, on_change: Callable[[], Awaitable[None]]) -> None:
        self.on_change = on_change
        """Called (awaited) after each change of ``backends``."""
        self._rules: dict[str, DnsDiscovery] = {}
        self._found: dict[str, list[str]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False

    @property
    def backends(self) -> list[BackendSpec]:
        return [
            backend_for(rule, address) for name, rule in self._rules.items() for address in self._found.get(name, [])
        ]

    def configure(self, rules: list[DnsDiscovery]) -> None:
        """Adopt a (reloaded) config's rules: a changed or removed rule forgets what it found, an
        unchanged one keeps it; call ``on_change`` after if ``backends`` may have changed."""
        wanted = {rule.name: rule for rule in rules}
        for name, rule in list(self._rules.items()):
            if wanted.get(name) != rule:
                self._stop_task(name)
                self._found.pop(name, None)
                del self._rules[name]
        for name, rule in wanted.items():
            if name not in self._rules:
                self._rules[name] = rule
                if self._running:
                    self._start_task(rule, look_now=True)

    async def start(self) -> None:
        """Look every rule up once (so the first backends are known before serving), then follow them."""
        self._running = True
        rounds = await asyncio.gather(*(self._look(rule, resolver_for(rule)) for rule in self._rules.values()))
        if any(rounds):
            await self.on_change()
        for rule in self._rules.values():
            self._start_task(rule, look_now=False)

    async def stop(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        for name in list(self._tasks):
            self._stop_task(name)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_task(self, rule: DnsDiscovery, look_now: bool) -> None:
        self._tasks[rule.name] = asyncio.get_running_loop().create_task(
            self._follow(rule, look_now), name=f"discovery.dns {rule.name}"
        )

    def _stop_task(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def _look(self, rule: DnsDiscovery, resolver: dns.asyncresolver.Resolver) -> bool:
        """One lookup; True when it changed what the rule found."""
        addresses = await lookup(rule, resolver)
        if addresses is None or addresses == self._found.get(rule.name):
            return False
        log.info("discovery.dns %s: %s has %s", rule.name, rule.host, ", ".join(addresses) or "no address")
        self._found[rule.name] = addresses
        return True

    async def _follow(self, rule: DnsDiscovery, look_now: bool) -> None:
        """Look ``rule`` up every interval (at once first with ``look_now``: a rule a reload added)."""
        resolver = resolver_for(rule)
        while True:
            if not look_now:
                await asyncio.sleep(rule.interval_s)
            look_now = False
            if await self._look(rule, resolver):
                try:
                    await self.on_change()
                except Exception:
                    log.exception("discovery.dns %s: applying the new backends failed", rule.name)
