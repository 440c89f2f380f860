"""The cost knobs of Dynamo's KV router, for the real ``select_service`` and its model alike.

``select_service`` 1.6.1 has no flag for them; it reads them from the environment (the
``DYN_ROUTER_*`` names of ``KvRouterConfig``, found in its library's strings and checked: with
``DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT`` set, the logit it logs for each pick follows the credit;
``kvgate bench dynamo-agreement --dynamo ...`` compares them with the model's). Defaults are
Dynamo's own. Its ``router_temperature`` (softmax sampling over the costs) is not offered: the
model picks the lowest cost, as Dynamo does at its default temperature 0.
"""

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

ENVIRONMENT = {
    "overlap_score_credit": "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT",
    "prefill_load_scale": "DYN_ROUTER_PREFILL_LOAD_SCALE",
    "decode_active_request_weight": "DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT",
}


@dataclass(frozen=True)
class DynamoConfig:
    overlap_score_credit: float = 1.0
    """Prefill blocks credited per block the worker holds of the prompt's prefix."""
    prefill_load_scale: float = 1.0
    """Weight of the prefill term (the worker's queued prefill plus the prompt, less the credit)."""
    decode_active_request_weight: float = 0.0
    """Cost of each request active on the worker, beside its active blocks."""

    @classmethod
    def from_settings(cls, settings: Mapping[str, object]) -> "DynamoConfig":
        """The config ``settings`` hold (a contender's ``routing``, ``dataclasses.asdict`` of one);
        raises ``ValueError`` naming a bad knob or value."""
        return cls(**{key: _knob(key, value) for key, value in settings.items()})

    def env(self) -> dict[str, str]:
        """The environment ``select_service`` reads these from."""
        return {ENVIRONMENT[field.name]: repr(getattr(self, field.name)) for field in dataclasses.fields(self)}

    def changed(self) -> str:
        """The knobs set away from Dynamo's defaults, ``key=value`` comma-separated ('' for none)."""
        return ",".join(
            f"{field.name}={getattr(self, field.name):g}"
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != field.default
        )


DYNAMO_DEFAULTS = DynamoConfig()


def parse_dynamo_config(text: str) -> DynamoConfig:
    """``default``, or comma-separated ``knob=value``; raises ``ValueError`` naming a bad knob or value."""
    if text.strip() in ("", "default"):
        return DYNAMO_DEFAULTS
    knobs: dict[str, object] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"unknown Dynamo knob {item.strip()!r}; knobs: {', '.join(ENVIRONMENT)} (key=value)")
        knobs[key.strip()] = value.strip()
    return DynamoConfig.from_settings(knobs)


def _knob(key: str, value: object) -> float:
    """One knob's value, checked: a known knob, a number, not negative."""
    if key not in ENVIRONMENT:
        raise ValueError(f"unknown Dynamo knob {key!r}; knobs: {', '.join(ENVIRONMENT)} (key=value)")
    try:
        number = float(str(value))
    except ValueError:
        raise ValueError(f"Dynamo knob {key} needs a number, not {value!r}") from None
    if number < 0:
        raise ValueError(f"Dynamo knob {key} must be >= 0, not {number:g}")
    return number


def add_dynamo_argument(parser: argparse.ArgumentParser, repeatable: bool) -> None:
    """``--dynamo KNOBS``: Dynamo's cost knobs (repeatable: one Dynamo contender each)."""
    more = " (repeat for one Dynamo contender each, default: Dynamo's defaults once)" if repeatable else ""
    parser.add_argument(
        "--dynamo",
        action="append" if repeatable else "store",
        type=_dynamo_config_arg,
        metavar="KNOBS",
        help=f"Dynamo's cost knobs, comma-separated key=value of {', '.join(ENVIRONMENT)}, or default{more}",
    )


def _dynamo_config_arg(text: str) -> DynamoConfig:
    try:
        return parse_dynamo_config(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
