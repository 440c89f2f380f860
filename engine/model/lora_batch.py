"""Which rows of a step run under which LoRA adapter, and the adapters' deltas on those rows.

The runner orders a step's chunks so that each adapter's rows are contiguous (at most one run
among the decodes and one among the prefills), so a segment is a slice of the packed tokens:
no gather, no scatter, no index tensor and no host sync. Per projection, each segment costs
two small matmuls over its own rows; base rows cost nothing, and a step without adapter rows
builds no ``LoRABatch`` at all.
"""

from dataclasses import dataclass

import torch

from engine.model.lora_weights import AdapterWeights


@dataclass(frozen=True)
class Segment:
    adapter: AdapterWeights
    start: int
    end: int


class LoRABatch:
    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments

    def add(self, out: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> None:
        """Add each segment's adapter delta for ``projection`` of ``layer`` into ``out`` (in place)."""
        for segment in self.segments:
            lora = segment.adapter.layers[layer].get(projection)
            if lora is not None:
                rows = slice(segment.start, segment.end)
                out[rows, lora.start : lora.end] += lora.delta(x[rows])


def segments_of(lora_ids: list[int], lengths: list[int], adapters: list[AdapterWeights]) -> list[Segment]:
    """Runs of consecutive chunks with one adapter (``lora_ids[i]`` of chunk ``i``; 0 is the base model)."""
    segments: list[Segment] = []
    start = 0
    for lora_id, length in zip(lora_ids, lengths, strict=True):
        end = start + length
        if lora_id:
            adapter = adapters[lora_id - 1]
            if segments and segments[-1].adapter is adapter and segments[-1].end == start:
                segments[-1] = Segment(adapter, segments[-1].start, end)
            else:
                segments.append(Segment(adapter, start, end))
        start = end
    return segments
