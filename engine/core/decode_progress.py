"""What the engine reports of each running decode (``ReplicaLoad.decodes``), shared by the engine's
load report and the simulated replica's."""

from engine.core.sequence import Sequence
from protocol.replica_stats import DecodeProgress


def decode_progress(seq: Sequence, first_token_s: float | None, last_token_s: float | None) -> DecodeProgress | None:
    """``seq``'s progress, or None before its first token or once it has nothing left to sample (a
    prefill leg's one token, a finished request)."""
    if first_token_s is None or last_token_s is None or seq.is_finished:
        return None
    left = seq.num_tokens_left
    if left <= 0:
        return None
    return DecodeProgress(seq.num_output_tokens, last_token_s - first_token_s, left)
