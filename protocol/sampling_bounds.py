"""Bounds on the sampling fields whose size sets the engine's work per generated token.

OpenAI takes at most 4 ``stop`` sequences and 300 ``logit_bias`` entries; the engine looks for
every stop string after each token (holding back as many characters as the longest one) and
applies every bias to every step, so both are bounded here, for gateway and engine alike.
"""

from protocol.openai_errors import bad_request

MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 1000
"""Characters of one stop string (OpenAI states no bound; streaming holds back this many)."""
MAX_LOGIT_BIAS = 300


def check_sampling_bounds(stop: str | list[str] | None, logit_bias: dict[str, float] | None) -> None:
    """Raise a 400 naming the field when ``stop`` or ``logit_bias`` is over its bound."""
    stops = [stop] if isinstance(stop, str) else stop or []
    if len(stops) > MAX_STOP_SEQUENCES:
        raise bad_request(
            f"'stop' has {len(stops)} sequences; at most {MAX_STOP_SEQUENCES} are allowed.",
            param="stop",
            code="too_many_stop_sequences",
        )
    for text in stops:
        if len(text) > MAX_STOP_CHARS:
            raise bad_request(
                f"A 'stop' sequence is {len(text)} characters long; the limit is {MAX_STOP_CHARS}.",
                param="stop",
                code="stop_sequence_too_long",
            )
    if logit_bias is not None and len(logit_bias) > MAX_LOGIT_BIAS:
        raise bad_request(
            f"'logit_bias' has {len(logit_bias)} entries; at most {MAX_LOGIT_BIAS} are allowed.",
            param="logit_bias",
            code="too_many_logit_bias_entries",
        )
