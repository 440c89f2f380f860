"""A model of NVIDIA Dynamo's KV router (its default worker selector), for ``bench simulate --peers``.

Written from ai-dynamo/dynamo's source, ``lib/kv-router/src/scheduling/``:

- ``selector/default.rs`` (``DefaultWorkerScorer::worker_logit``): per worker,
  ``logit = prefill_load_scale * max(raw_prefill_blocks - overlap_credit_blocks, 0)
  + decode_cost_blocks + decode_active_request_weight * active_requests``; lowest wins.
  ``overlap_credit_blocks = overlap_score_credit * device_overlap_blocks`` (+ 0.75 x host and
  0.25 x disk overlap blocks, ``host_cache_hit_weight`` / ``disk_cache_hit_weight``: no such tiers
  here).
- ``selector/mod.rs`` (``WorkerSelectionInput::row``): ``raw_prefill_blocks = (active_prefill_tokens
  + uncached + cached) / block_size``, i.e. ``(active_prefill_tokens + ISL) / B``;
  ``decode_cost_blocks = potential_decode_blocks()``.
- ``sequences/prompt_registry.rs`` (``WorkerLoadProjection::potential_decode_blocks``): the
  worker's unique active blocks (every prompt block of the requests routed there and not yet
  freed, deduplicated by hash, ``router_assume_kv_reuse`` true) plus the request's blocks not
  already among them.
- ``sequences/single.rs`` (``add_request_with_prefill_tracking``): a routed request adds
  ``new_tokens(isl, overlap) = isl - overlap x B`` to the worker's active prefill tokens until the
  caller reports its prefill complete (first token); its blocks stay active until it is freed.
- ``selector/default.rs`` (``minimum_cost_index``): at temperature 0 the lowest cost wins, ties
  broken uniformly at random (reservoir sampling); seeded here, so runs repeat.
- Defaults (``config.rs``, ``KvRouterConfig::default``; the same in ai-dynamo-runtime 1.6.1's
  ``dynamo/_core.pyi`` ``KvRouterConfig`` signature): ``overlap_score_credit`` 1.0,
  ``overlap_score_credit_decay`` 0, ``prefill_load_scale`` 1.0, ``decode_active_request_weight`` 0,
  ``router_temperature`` 0, ``router_track_active_blocks`` and ``router_assume_kv_reuse`` on,
  ``router_track_output_blocks`` off. The three cost knobs are a ``DynamoConfig``
  (bench/peers/dynamo_config.py), which the real select_service is started with too.

The overlap comes from the replicas' KV events (``PeerKVIndex``), as Dynamo's indexer builds it.
Not modelled: the router queue (``router_queue_threshold``: None in 1.6.1's Python binding, so
requests go straight to a worker) and the credit decay and output-block tracking (both off).
"""

import random
from collections import Counter
from dataclasses import dataclass, field

from bench.peers.dynamo_config import DYNAMO_DEFAULTS, DynamoConfig
from bench.sim.peer_kv_index import PeerKVIndex
from radix.hashing import BlockHash


@dataclass
class _Active:
    replica: str
    blocks: list[BlockHash]
    prefill_tokens: int


@dataclass
class DynamoKVRouter:
    replicas: list[str]
    block_size: int
    index: PeerKVIndex
    seed: int = 0
    config: DynamoConfig = DYNAMO_DEFAULTS
    _active: dict[str, _Active] = field(init=False, default_factory=dict)
    _prefill_tokens: Counter[str] = field(init=False, default_factory=Counter)
    _requests: Counter[str] = field(init=False, default_factory=Counter)
    _blocks: dict[str, Counter[BlockHash]] = field(init=False)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._blocks = {name: Counter() for name in self.replicas}
        self._rng = random.Random(self.seed)

    def costs(
        self, block_hashes: list[BlockHash], prompt_tokens: int, overlap: dict[str, int] | None = None
    ) -> dict[str, float]:
        """Each worker's logit for this prompt (lower is better); ``overlap`` (blocks per worker)
        replaces the index's view of the replicas' caches."""
        overlap = self.index.prefix_blocks(block_hashes) if overlap is None else overlap
        config = self.config
        costs: dict[str, float] = {}
        for name in self.replicas:
            raw_prefill_blocks = (self._prefill_tokens[name] + prompt_tokens) / self.block_size
            credit = config.overlap_score_credit * overlap[name]
            active = self._blocks[name]
            potential_decode_blocks = len(active) + sum(1 for block in block_hashes if block not in active)
            costs[name] = (
                config.prefill_load_scale * max(raw_prefill_blocks - credit, 0.0)
                + potential_decode_blocks
                + config.decode_active_request_weight * self._requests[name]
            )
        return costs

    def route(self, request_id: str, block_hashes: list[BlockHash], prompt_tokens: int) -> tuple[str, str]:
        """The worker with the lowest cost (ties at random), now reserved for the request."""
        tied = lowest(self.costs(block_hashes, prompt_tokens))
        chosen = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        overlap_tokens = self.index.prefix_blocks(block_hashes)[chosen] * self.block_size
        self.reserve(request_id, chosen, block_hashes, max(prompt_tokens - overlap_tokens, 0))
        return chosen, "kv-cost" if len(tied) == 1 else "kv-cost-tie"

    def reserve(self, request_id: str, chosen: str, block_hashes: list[BlockHash], prefill_tokens: int) -> None:
        """Count the request on ``chosen`` (``select_and_reserve``'s reservation): ``prefill_tokens``
        (its prompt less the overlap there) as prefill load, its blocks as active."""
        self._active[request_id] = _Active(chosen, list(block_hashes), prefill_tokens)
        self._prefill_tokens[chosen] += prefill_tokens
        self._requests[chosen] += 1
        self._blocks[chosen].update(block_hashes)

    def first_token(self, request_id: str) -> None:
        """The caller's ``prefill_complete``: the request's prompt no longer counts as prefill load."""
        active = self._active[request_id]
        self._prefill_tokens[active.replica] -= active.prefill_tokens
        active.prefill_tokens = 0

    def finished(self, request_id: str) -> None:
        """The caller's ``DELETE /reservations/{id}``: its blocks leave the worker's active set."""
        active = self._active.pop(request_id)
        self._prefill_tokens[active.replica] -= active.prefill_tokens
        self._requests[active.replica] -= 1
        blocks = self._blocks[active.replica]
        blocks.subtract(active.blocks)
        for block in set(active.blocks):
            if blocks[block] <= 0:
                del blocks[block]


def lowest(costs: dict[str, float]) -> list[str]:
    """The workers of lowest cost, in worker order (more than one: a tie Dynamo breaks at random)."""
    best = min(costs.values())
    return [name for name, cost in costs.items() if cost == best]
