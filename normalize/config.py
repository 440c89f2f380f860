"""The ``normalize:`` section of config.yaml: which rules run, and on which parts of a request.

Every rule is named and switched on or off under ``rules``. The defaults change only what cannot
change a prompt's meaning (Unicode form, line endings, invisible characters, whitespace at line
and message ends, JSON key order of tool definitions); the rest is opt-in.
"""

import regex
from pydantic import BaseModel, ConfigDict, Field, field_validator

from normalize.volatile_spans import PRESETS


class RuleSwitches(BaseModel):
    """One switch per rule; the names are those reported in ``x-kvgate-normalized``."""

    model_config = ConfigDict(extra="forbid")

    invisible_chars: bool = True
    """Remove the BOM (U+FEFF), zero-width space (U+200B) and word joiner (U+2060)."""
    nfc: bool = True
    line_endings: bool = True
    """CRLF and lone CR become LF."""
    trailing_whitespace: bool = True
    """Whitespace at the end of each line."""
    strip_message: bool = True
    """Whitespace at the start and end of the whole message."""
    collapse_spaces: bool = False
    """Runs of spaces and tabs, and single tabs, become one space (changes code indentation)."""
    volatile_spans: bool = False
    """Move matches of ``volatile_spans`` patterns to a note after the stable text."""
    canonical_tools: bool = True
    """Tool definitions with JSON object keys sorted recursively."""
    sort_tools: bool = False
    """Tool definitions ordered by function name (changes the order the model reads them in)."""


class VolatilePattern(BaseModel):
    """An operator's own volatile-span regex."""

    model_config = ConfigDict(extra="forbid")

    name: str
    pattern: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            compiled = regex.compile(pattern)
        except regex.error as exc:
            raise ValueError(f"invalid regex {pattern!r}: {exc}") from exc
        if compiled.match(""):
            raise ValueError(f"regex {pattern!r} matches the empty string")
        return pattern


def _every_preset() -> list[str | VolatilePattern]:
    return list(PRESETS)


class NormalizeConfig(BaseModel):
    """What the gateway canonicalizes before hashing and forwarding a request."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    """Off: requests are forwarded and hashed exactly as sent."""
    roles: list[str] = Field(default_factory=lambda: ["system", "developer"])
    """Message roles whose text the rules own; add ``user``/``assistant`` to normalize those too."""
    completions_prompt: bool = False
    """Also apply invisible_chars, nfc and line_endings to a ``/v1/completions`` string prompt
    (whitespace and volatile-span rules never touch a prompt the model continues from its end)."""
    rules: RuleSwitches = Field(default_factory=RuleSwitches)
    volatile_spans: list[str | VolatilePattern] = Field(default_factory=_every_preset)
    """Preset names (iso_datetime, date, time, uuid, request_id; default: all) or ``{name, pattern}``;
    used when ``rules.volatile_spans`` is on."""

    @field_validator("volatile_spans")
    @classmethod
    def _known_presets(cls, spans: list[str | VolatilePattern]) -> list[str | VolatilePattern]:
        unknown = [span for span in spans if isinstance(span, str) and span not in PRESETS]
        if unknown:
            raise ValueError(f"unknown volatile-span presets {unknown}; presets are {sorted(PRESETS)}")
        return spans

    def volatile_patterns(self) -> dict[str, str]:
        """Name -> regex of every configured volatile span, presets resolved."""
        patterns: dict[str, str] = {}
        for span in self.volatile_spans:
            if isinstance(span, str):
                patterns[span] = PRESETS[span]
            else:
                patterns[span.name] = span.pattern
        return patterns
