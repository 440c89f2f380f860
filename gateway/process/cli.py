"""The ``kvgate`` command: each subcommand hands its arguments to the part that owns it."""

import sys
from collections.abc import Callable
from importlib import import_module

_EXTRA_OF_PACKAGE: dict[str, str] = {
    "torch": "engine",
    "accelerate": "engine",
    "llguidance": "engine",
    "matplotlib": "bench",
    "grpc": "epp",
    "grpc_health": "epp",
    "envoy": "epp",
}
"""Packages that only kvgate's extras bring: `pip install kvgate` (the gateway alone) has none of them."""

_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("gateway.process.supervisor", "start the engines listed in the config, then the gateway"),
    "gateway": ("gateway.process.server", "run the gateway alone, in front of the config's backends"),
    "engine": ("engine.cli", "run one bundled engine replica (real model or --sim)"),
    "epp": ("gateway.epp.server", "run an Envoy ext_proc endpoint picker (Gateway API Inference Extension)"),
    "plan": ("planner.cli", "KV-cache arithmetic: bytes per token, per sequence, concurrency per card"),
    "bench": ("bench.cli", "benchmarks: workloads, contenders, reports"),
}


def _usage() -> str:
    lines = ["usage: kvgate {" + ",".join(_SUBCOMMANDS) + "} [--help] ...", "", "commands:"]
    lines += [f"  {name:<9} {summary}" for name, (_, summary) in _SUBCOMMANDS.items()]
    lines.append("\nRun 'kvgate COMMAND --help' for the flags of one command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``kvgate COMMAND ...`` to ``<module>.main(argv)``."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] not in _SUBCOMMANDS:
        print(f"kvgate: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _ = _SUBCOMMANDS[args[0]]
    try:
        command_main: Callable[[list[str]], int] = import_module(module_name).main
        return command_main(args[1:])
    except ModuleNotFoundError as error:
        extra = _EXTRA_OF_PACKAGE.get((error.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"kvgate {args[0]}: needs {error.name}, from pip install 'kvgate[{extra}]'", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
