"""The modelled peer routers ``bench simulate --peers`` runs beside kvgate, behind one interface.

Each model places a request (``route``) and hears when its first token came back (``first_token``,
Dynamo's ``prefill_complete``) and when it finished (``finished``). Precise models read the
replicas' KV events through a ``PeerKVIndex``; llm-d's also scrapes pod metrics (``observe``).
"""

from typing import Protocol

from bench.harness.contenders import Contender, dynamo_contender
from bench.peers.dynamo_config import DYNAMO_DEFAULTS, DynamoConfig
from bench.sim.dynamo_model import DynamoKVRouter
from bench.sim.llmd_model import LlmdPrecisePrefix
from bench.sim.peer_kv_index import PeerKVIndex
from bench.sim.sglang_model import SglangCacheAware
from radix.hashing import BlockHash

MODELLED = " (modelled)"
"""The end of every modelled peer's name (``kvgate bench seed-spread`` finds the peers by it)."""
SGLANG_MODELLED = Contender("sglang-router", "cache_aware", label=f"sglang-router cache_aware{MODELLED}")
DYNAMO_MODELLED = dynamo_contender(DYNAMO_DEFAULTS, "dynamo kv-router", MODELLED)
LLMD_MODELLED = Contender("llm-d", "precise-prefix-cache", label=f"llm-d precise-prefix{MODELLED}")
MODELLED_PEERS = (SGLANG_MODELLED, DYNAMO_MODELLED, LLMD_MODELLED)
"""The contenders ``bench simulate --peers`` adds, in report order."""


def is_modelled(contender: Contender) -> bool:
    """A router (kind and policy) ``bench simulate`` has a model of, whatever its settings."""
    return any(peer.kind == contender.kind and peer.policy == contender.policy for peer in MODELLED_PEERS)


def modelled_peers(dynamo: list[DynamoConfig]) -> list[Contender]:
    """``MODELLED_PEERS`` with Dynamo's model once per config in ``dynamo``."""
    dynamos = [dynamo_contender(config, "dynamo kv-router", MODELLED) for config in dynamo]
    return [SGLANG_MODELLED, *dynamos, LLMD_MODELLED]


class PeerModel(Protocol):
    def route(self, request_id: str, block_hashes: list[BlockHash], prompt_tokens: int) -> tuple[str, str]: ...

    def first_token(self, request_id: str) -> None: ...

    def finished(self, request_id: str) -> None: ...


class SglangPeer:
    """sglang-router's model keyed by request: it counts load per worker, not per request."""

    def __init__(self, replicas: list[str], block_size: int) -> None:
        self.model = SglangCacheAware(replicas, block_size)
        self._placed: dict[str, str] = {}

    def route(self, request_id: str, block_hashes: list[BlockHash], prompt_tokens: int) -> tuple[str, str]:
        name, reason = self.model.route(block_hashes, prompt_tokens)
        self._placed[request_id] = name
        return name, reason

    def first_token(self, request_id: str) -> None:
        """Nothing: sglang-router counts a request as load until it finishes."""

    def finished(self, request_id: str) -> None:
        self.model.finished(self._placed.pop(request_id))


def build_peer(contender: Contender, replicas: list[str], block_size: int, seed: int = 0) -> PeerModel:
    """The model behind a modelled peer (``modelled_peers``); ``seed`` breaks its ties."""
    if contender.kind == SGLANG_MODELLED.kind:
        return SglangPeer(replicas, block_size)
    if contender.kind == DYNAMO_MODELLED.kind:
        return DynamoKVRouter(
            replicas, block_size, PeerKVIndex(replicas), seed, DynamoConfig.from_settings(contender.routing)
        )
    if contender.kind == LLMD_MODELLED.kind:
        return LlmdPrecisePrefix(replicas, PeerKVIndex(replicas), seed)
    raise ValueError(f"no model of {contender.name}")


def kv_index_of(peer: PeerModel) -> PeerKVIndex | None:
    """The KV-event index a precise model reads, which the fleet must feed."""
    return peer.index if isinstance(peer, DynamoKVRouter | LlmdPrecisePrefix) else None


def metrics_scraper_of(peer: PeerModel) -> LlmdPrecisePrefix | None:
    """The model that scrapes pod metrics (every ``metrics_refresh_s``, through ``observe``), if it does."""
    return peer if isinstance(peer, LlmdPrecisePrefix) else None
