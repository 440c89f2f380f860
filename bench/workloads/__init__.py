"""Workload generators by name, and ``--set key=value`` overrides of their parameters."""

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.workloads import hotspot_burst, multi_turn, normalization_noise, shared_prefix, skew, trace_replay
from bench.workloads.types import BenchRequest


@dataclass(frozen=True)
class Workload:
    params_type: type
    generate: Callable[[Any, Sequence[int]], list[BenchRequest]]
    chat: bool
    """Sends chat messages (else token-id prompts to /v1/completions)."""


WORKLOADS: dict[str, Workload] = {
    "shared-prefix": Workload(shared_prefix.SharedPrefixParams, shared_prefix.generate, chat=False),
    "multi-turn": Workload(multi_turn.MultiTurnParams, multi_turn.generate, chat=False),
    "trace-replay": Workload(trace_replay.TraceReplayParams, trace_replay.generate, chat=False),
    "normalization-noise": Workload(
        normalization_noise.NormalizationNoiseParams,
        lambda params, vocab: normalization_noise.generate(params),
        chat=True,
    ),
    "skew": Workload(skew.SkewParams, skew.generate, chat=False),
    "hotspot-burst": Workload(hotspot_burst.HotspotBurstParams, hotspot_burst.generate, chat=False),
}


def with_overrides(params: Any, overrides: dict[str, str]) -> Any:
    """A copy of a params dataclass with fields set from strings, converted to each field's type."""
    fields = {field.name: field for field in dataclasses.fields(params)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"unknown parameters {unknown}; {type(params).__name__} has {sorted(fields)}")
    values = {name: type(getattr(params, name))(text) for name, text in overrides.items()}
    return dataclasses.replace(params, **values)
