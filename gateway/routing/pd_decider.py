"""Whether one request prefills on a prefill replica and decodes on another (P/D disaggregation).

Pure arithmetic on the router's own estimator (``RouteContext``: queue wait + uncached tokens /
prefill rate), shared by the gateway's dispatch and ``bench simulate``. Each way is costed as its
estimated TTFT plus the stall its prefill puts on decodes, the prefill's seconds beyond
``stall_free_tokens`` times:

- on a replica that serves both phases and reports its decodes (the bundled engine):
  ``missed_itl_weight`` x the decodes that stall pushes past ``itl_target_s``
  (gateway/routing/decode_slack.py). Such a replica prefills anyway; what a stall costs there is
  the decodes it breaks, and a replica whose decodes have room takes it for nothing;
- otherwise (a ``decode`` replica, or one that does not report its decodes): ``itl_weight`` x the
  decodes it delays, at least one (the next one sent there). Keeping a decode replica's steps free
  of prefills is what it is for: pricing its stalls by the decodes they break split too seldom and
  lost 2-4 points of goodput with dedicated prefill replicas (bench/notes/2026-12-03-pd-decode-slack.md).

The two ways:

- local: the decode replica prefills what it lacks, stalling its own running decodes;
- split: the prefill replica prefills what *it* lacks, the decode replica pulls the blocks it
  lacks (``kv_bytes_per_token`` / ``kv_bandwidth_bytes_per_s`` a token) and only then queues
  the request, its queue wait counted in full; only a prefill replica that also decodes
  (``role: both``) has decodes to stall. The engine starts a pulled request ahead of the prefills
  queued there (engine/core/scheduler.py), so the full wait overstates what it waits, but it
  also stands for the prefills routed there meanwhile, which stall the decode once it runs:
  counting none split more requests on every set and reached the P/D bar on 37 of 56 windows
  in ``bench simulate-pd``, against 50 (bench/notes/2026-12-03-pulled-requests-first.md).

The split wins when it costs less. That gives the peers' rules as special cases, with the load
and the transfer priced in: llm-d's ``prefix-based-pd-decider`` splits when the decode replica's
uncached suffix reaches ``nonCachedTokens``, Dynamo's conditional disaggregation when it exceeds
``max_local_prefill_length`` and the prefill queue is short. Here a warm follow-up or a short
prompt stays local (a prefill under ``stall_free_tokens`` stalls no one, and the split only adds
the transfer), a long uncached prompt on a decode replica that is decoding splits, and a queue at
the prefill replica or a slow link keeps it local.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from gateway.routing.config import DisaggregationConfig
from gateway.routing.context import RouteContext, ScoringSettings
from gateway.routing.decode_slack import decodes_pushed_past
from gateway.routing.output_lengths import OutputLengths
from gateway.routing.types import ReplicaState, RouteRequest


@dataclass(frozen=True)
class PdDecision:
    disaggregate: bool
    reason: str
    """Short, for the route reason, e.g. ``pd-split: est 0.42s vs local 1.10s``."""
    local_cost_s: float
    """Estimated TTFT + weighted decode stall of prefilling on the decode replica (0 when not costed)."""
    split_cost_s: float
    """The same for prefilling on the prefill replica and moving the KV (0 when not costed)."""


def fleet_disaggregates(roles: Iterable[str], settings: DisaggregationConfig) -> bool:
    """A fleet of replicas with these roles may split a request: one declares a phase (``prefill`` or
    ``decode``), or ``among_both`` lets replicas that are all ``both`` split among themselves."""
    return settings.among_both or any(role != "both" for role in roles)


def transfer_s_per_token(settings: DisaggregationConfig) -> float:
    """Seconds one prompt token's KV takes to move from the prefill replica to the decode replica."""
    return settings.kv_bytes_per_token / settings.kv_bandwidth_bytes_per_s


def decide_disaggregation(
    request: RouteRequest,
    decode: ReplicaState,
    decode_cached_tokens: int,
    prefill: ReplicaState | None,
    prefill_cached_tokens: int,
    routing: ScoringSettings,
    settings: DisaggregationConfig,
    transfer_s: float | None = None,
    prefill_decodes: bool = False,
    decode_prefills: bool = False,
    lengths: OutputLengths | None = None,
) -> PdDecision:
    """Split ``request`` between ``prefill`` and ``decode``, or prefill it on ``decode``.

    ``*_cached_tokens``: the router's predicted cached prompt tokens on each replica.
    ``transfer_s``: seconds per token moved (default ``transfer_s_per_token(settings)``).
    ``prefill_decodes``: the prefill replica also runs decodes (``role: both``), so its prefill
    stalls them as a local one would stall the decode replica's. ``decode_prefills``: the decode
    replica serves both phases (``role: both``). ``lengths``: completed answers, to tell how soon
    each decode will stop (``decode_slack.decodes_pushed_past``).
    """
    if prefill is None or prefill.name == decode.name or not prefill.healthy:
        return PdDecision(False, "pd-local: no prefill replica", 0.0, 0.0)
    if settings.mode == "never":
        return PdDecision(False, "pd-never", 0.0, 0.0)
    if settings.mode == "always":
        return PdDecision(True, "pd-always", 0.0, 0.0)
    per_token = transfer_s_per_token(settings) if transfer_s is None else transfer_s
    context = RouteContext(request, [decode, prefill], {}, {}, routing)
    prompt = request.prompt_tokens
    local_uncached = max(prompt - decode_cached_tokens, 0)
    split_uncached = max(prompt - prefill_cached_tokens, 0)
    decode_rate, prefill_rate = context.prefill_rate(decode), context.prefill_rate(prefill)

    local_ttft = context.queue_wait_s(decode) + local_uncached / decode_rate
    local_cost = local_ttft + _stall_cost_s(decode, local_uncached, decode_rate, settings, decode_prefills, lengths)

    split_ready = (
        context.queue_wait_s(prefill)
        + split_uncached / prefill_rate
        + local_uncached * per_token
        + settings.split_overhead_s
    )
    split_ttft = split_ready + context.queue_wait_s(decode)
    split_stall = (
        _stall_cost_s(prefill, split_uncached, prefill_rate, settings, True, lengths) if prefill_decodes else 0.0
    )
    split_cost = split_ttft + split_stall

    if split_cost < local_cost:
        return PdDecision(True, f"pd-split: est {split_cost:.2f}s vs local {local_cost:.2f}s", local_cost, split_cost)
    held = decode_cached_tokens / prompt if prompt else 0.0
    reason = f"pd-local: est {local_cost:.2f}s vs split {split_cost:.2f}s, {held:.0%} cached"
    return PdDecision(False, reason, local_cost, split_cost)


def _stall_cost_s(
    replica: ReplicaState,
    uncached: int,
    rate: float,
    settings: DisaggregationConfig,
    serves_both: bool,
    lengths: OutputLengths | None,
) -> float:
    """Seconds of TTFT that a prefill of ``uncached`` tokens on ``replica`` is worth in stalled
    decodes: they wait out the part of it a decode step cannot hide. Priced by the decodes it pushes
    past ``itl_target_s`` where ``replica`` serves both phases and reports them; otherwise by each
    decode running there, and at least the next one sent there while it runs."""
    stall = max(uncached - settings.stall_free_tokens, 0) / rate
    if serves_both and replica.decodes is not None:
        return (
            settings.missed_itl_weight
            * decodes_pushed_past(replica.decodes, stall, settings.itl_target_s, lengths)
            * stall
        )
    decodes = replica.num_running if replica.num_running is not None else replica.in_flight
    return settings.itl_weight * max(decodes, 1) * stall
