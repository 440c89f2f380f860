"""What the engine reports of each request that will decode (``ReplicaLoad.decodes``), shared by the
engine's load report and the simulated replica's."""

from engine.core.sequence import Sequence
from protocol.replica_stats import DecodeProgress


def decode_progress(seq: Sequence, first_token_s: float | None, last_token_s: float | None) -> DecodeProgress | None:
    """``seq``'s progress (no tokens and no decode time before its first token), or None when no
    inter-token interval is left to come: a finished request, a prefill leg's one token."""
    if seq.is_finished:
        return None
    left = seq.num_tokens_left
    if first_token_s is None or last_token_s is None:
        return DecodeProgress(0, 0.0, left) if left > 1 else None
    if left <= 0:
        return None
    return DecodeProgress(seq.num_output_tokens, last_token_s - first_token_s, left)
