"""When a ``prefill`` replica serves client requests too: only while the fleet is past capacity.

A mixed fleet (one ``prefill`` replica in eight, the others ``both``) reaches the P/D bar on more
trace windows than a fleet of ``both`` replicas, but past its capacity it has an eighth less to
decode with: at trace time / 16 it fell 11 points of goodput behind aggregated on two of four
windows (bench/notes/2026-12-04-pd-mixed-fleet.md). With ``disaggregation.prefill_overflow_s``
set, a ``prefill`` replica joins the replicas a client request may go to while every one of those
has more than that many seconds of prefill queued. At 1.0 s that never happened on the 56 trace
windows of the P/D goal (every run identical) and won most of the overload loss back.
Shared by the gateway's dispatch (gateway/backends/pool.py) and ``bench simulate-pd``.
"""

from collections.abc import Callable, Sequence
from typing import TypeVar

from gateway.routing.config import DisaggregationConfig
from gateway.routing.types import ReplicaState

SlotT = TypeVar("SlotT")


def queued_prefill_s(state: ReplicaState, assumed_tokens_per_s: float) -> float:
    """Seconds of prefill queued at the replica: its reported queue (else the gateway's own count)
    at its measured prefill rate (else the assumed one)."""
    queued = state.queued_prefill_tokens
    if queued is None:
        queued = state.in_flight_prefill_tokens
    return queued / (state.prefill_tokens_per_s or assumed_tokens_per_s)


def prefill_replicas_serve(
    serving: Sequence[ReplicaState], settings: DisaggregationConfig, assumed_tokens_per_s: float
) -> bool:
    """Whether ``prefill`` replicas take client requests now: ``prefill_overflow_s`` is set and every
    replica that serves clients has more prefill than that queued."""
    limit = settings.prefill_overflow_s
    return (
        limit is not None
        and bool(serving)
        and all(queued_prefill_s(state, assumed_tokens_per_s) > limit for state in serving)
    )


def client_candidates(
    usable: Sequence[SlotT],
    takes_clients: Callable[[SlotT], bool],
    state: Callable[[SlotT], ReplicaState],
    settings: DisaggregationConfig,
    assumed_tokens_per_s: float,
) -> list[SlotT]:
    """The ``usable`` replicas a client request may go to: those that ``takes_clients`` (every role but
    ``prefill``), and the ``prefill`` ones too while ``prefill_replicas_serve`` (a state is read only
    then)."""
    serving = [slot for slot in usable if takes_clients(slot)]
    if settings.prefill_overflow_s is None or len(serving) == len(usable):
        return serving
    overflowing = prefill_replicas_serve([state(slot) for slot in serving], settings, assumed_tokens_per_s)
    return list(usable) if overflowing else serving
