"""Every discovery mode the config names (``discovery.dns``, ``discovery.kubernetes``), as one: the
gateway configures, starts and stops them together and serves what they found beside its backends."""

from collections.abc import Awaitable, Callable

from gateway.backends.discovery_config import DiscoveryConfig
from gateway.backends.dns_discovery import DnsDiscoverer
from gateway.backends.k8s_discovery import KubernetesDiscoverer
from gateway.config import BackendSpec


class Discovery:
    def __init__(self, on_change: Callable[[], Awaitable[None]]) -> None:
        self.dns = DnsDiscoverer(on_change)
        self.kubernetes = KubernetesDiscoverer(on_change)

    @property
    def backends(self) -> list[BackendSpec]:
        return [*self.dns.backends, *self.kubernetes.backends]

    def configure(self, config: DiscoveryConfig) -> None:
        """Adopt a (reloaded) config's rules; call ``on_change`` after if ``backends`` may have changed."""
        self.dns.configure(config.dns)
        self.kubernetes.configure(config.kubernetes)

    async def start(self) -> None:
        await self.dns.start()
        await self.kubernetes.start()

    async def stop(self) -> None:
        await self.dns.stop()
        await self.kubernetes.stop()
