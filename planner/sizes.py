"""Memory sizes as people write them ("24GiB", "80GB", "24") and as the planner prints them."""

import re

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
_BINARY_STEPS = ("B", "KiB", "MiB", "GiB", "TiB")


def parse_memory_size(text: str) -> int:
    """Bytes in ``text``; a bare number means GiB. Raises ValueError on anything else."""
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _UNITS):
        raise ValueError(f"not a memory size: {text!r} (examples: 24GiB, 80GB, 512MiB, 24 meaning GiB)")
    return int(float(match.group(1)) * _UNITS[unit or "gib"])


def format_bytes(count: int) -> str:
    """``count`` bytes in the largest binary unit that keeps the number >= 1 ("1.25 GiB")."""
    value, step = float(count), 0
    while abs(value) >= 1024 and step < len(_BINARY_STEPS) - 1:
        value, step = value / 1024, step + 1
    return f"{count} B" if step == 0 else f"{value:.4g} {_BINARY_STEPS[step]}"
