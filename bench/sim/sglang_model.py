"""A model of sglang-router's ``cache_aware`` policy, for ``kvgate bench simulate``.

``bench run`` runs the real sglang-router; this models its placement rules in virtual time, so
a trace window can be compared with kvgate request by request, exactly and without timing
noise. Written from sglang-router's documented behaviour (its ``--help`` and the policy's
description in sgl-project/sglang, ``sgl-router/src/policies/cache_aware.rs``), not from its code:

- **Imbalance first.** Its load is the requests it has sent to a worker and not yet seen
  finish. When ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min``,
  the request goes to the least-loaded worker.
- **Else the approximate tree.** One tree of every prompt it has routed, each node tagged with
  the workers it sent that text to. It never learns what an engine evicted: entries leave only
  when a worker's tree passes ``max_tree_size`` (64 M characters by default, never reached in
  these benchmarks), so the model keeps everything. The longest match over all workers picks
  the worker at the end of that match (the first tagged there) when it covers more than
  ``cache_threshold`` of the prompt; otherwise the worker with the smallest tree wins.
- Matching is on characters of text there and on ``block_size``-token blocks here. Trace
  prompts share whole 64-token blocks, so the two agree on the traces; a match ending inside a
  block is counted one block short.

Defaults are sglang-router 0.3.2's (the version ``bench run`` installs).
"""

from dataclasses import dataclass, field

from radix.hashing import BlockHash


@dataclass
class SglangCacheAware:
    replicas: list[str]
    block_size: int
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    load: dict[str, int] = field(init=False)
    """Requests sent to each worker and not finished."""
    tree_tokens: dict[str, int] = field(init=False)
    """Tokens of the tree tagged with each worker (sglang-router's per-tenant character count;
    whole blocks only, as ``block_hashes`` hashes only full blocks)."""
    _tagged: dict[BlockHash, dict[str, None]] = field(init=False, default_factory=dict)
    """Block hash (it names its whole prefix) -> workers tagged there, in the order they were."""

    def __post_init__(self) -> None:
        self.load = dict.fromkeys(self.replicas, 0)
        self.tree_tokens = dict.fromkeys(self.replicas, 0)

    def route(self, block_hashes: list[BlockHash], prompt_tokens: int) -> tuple[str, str]:
        """The worker for a prompt and why (``imbalanced``, ``cache-hit`` or ``smallest-tree``);
        the prompt is recorded under it, as sglang-router records every routed request."""
        chosen, reason = self._choose(block_hashes, prompt_tokens)
        self._insert(block_hashes, chosen)
        self.load[chosen] += 1
        return chosen, reason

    def finished(self, replica: str) -> None:
        self.load[replica] -= 1

    def _choose(self, block_hashes: list[BlockHash], prompt_tokens: int) -> tuple[str, str]:
        most, least = max(self.load.values()), min(self.load.values())
        if most - least > self.balance_abs_threshold and most > least * self.balance_rel_threshold:
            return min(self.replicas, key=lambda name: self.load[name]), "imbalanced"
        matched_blocks, holders = 0, None
        for block_hash in block_hashes:
            tagged = self._tagged.get(block_hash)
            if tagged is None:
                break
            matched_blocks, holders = matched_blocks + 1, tagged
        matched = min(matched_blocks * self.block_size, prompt_tokens)
        if holders and prompt_tokens and matched / prompt_tokens > self.cache_threshold:
            return next(iter(holders)), "cache-hit"
        return min(self.replicas, key=lambda name: self.tree_tokens[name]), "smallest-tree"

    def _insert(self, block_hashes: list[BlockHash], replica: str) -> None:
        for block_hash in block_hashes:
            tagged = self._tagged.setdefault(block_hash, {})
            if replica not in tagged:
                tagged[replica] = None
                self.tree_tokens[replica] += self.block_size
