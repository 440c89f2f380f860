"""Suite-wide settings and the split that `make test-fast` relies on.

A test module is ``slow`` when it, or a tests/ helper it imports, imports something that starts
processes or loads the model (HEAVY_IMPORTS). `make test-fast` runs ``-m "not slow"``: the unit
and in-process tests. Under that selection a test that still starts a Python child process fails
and names its module, so the split stays honest as tests are added.
"""

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from bench.harness import processes
from tests.procs import ManagedProcess, http

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
"""OpenMP threads (torch's, here and in the engines this suite starts) sleep instead of spinning while
they wait: with two test workers on two cores, spinning threads took the cores from each other and
the real-model tests ran twice as long (tests/engine/test_model_runner.py, test_engine_real.py and
test_host_tier_real.py under `-n 2`: 145 s spinning, 67 s passive; 94 s one worker at a time)."""

TESTS = Path(__file__).resolve().parent
HEAVY_IMPORTS = (
    "subprocess",
    "multiprocessing",
    "bench.harness.processes.launch",
    "bench.harness.processes.module_command",
    "bench.harness.processes.kvgate_command",
    "engine.model.model_runner",
    "engine.model.loader",
    "engine.model.llama",
    "transformers",
    "torch",
)
"""What marks a test module slow when imported: process starters and the model's loaders."""
FAST_SELECTION = "not slow"


@cache
def _imports(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What ``path`` imports at any depth of its syntax tree: (names, modules), ``from m import n`` giving m.n and m."""
    names: list[str] = []
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
            modules.append(node.module)
    return tuple(names), tuple(modules)


def _helper_path(module: str) -> Path | None:
    """The file of a tests/ helper module (``tests.procs`` -> tests/procs.py), if it is one."""
    if not module.startswith("tests."):
        return None
    base = TESTS.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def is_heavy(path: Path) -> bool:
    """Whether ``path`` imports, itself or through tests/ helpers, something of HEAVY_IMPORTS."""
    names, modules = _imports(path)
    if any(name == heavy or name.startswith(f"{heavy}.") for name in names for heavy in HEAVY_IMPORTS):
        return True
    helpers = {_helper_path(module) for module in modules} - {None, path}
    return any(is_heavy(helper) for helper in helpers if helper is not None)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two workers), each worker draws child ports from its own slice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None:
        processes.PORT_SHARE = (int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_heavy(Path(str(item.path))):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_python_children_when_fast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Under ``-m "not slow"``, starting a Python child (an engine, a gateway, a CLI) fails the test."""
    if request.config.option.markexpr != FAST_SELECTION:
        yield
        return
    popen_init = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        command = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        if command and os.path.basename(str(command[0])).startswith(("python", os.path.basename(sys.executable))):
            pytest.fail(f"{request.node.path} starts {command[:4]}: it belongs in the slow tests (tests/conftest.py)")
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield


SHARED_ENGINE_FLAGS = ("--num-blocks", "512", "--max-model-len", "2048", "--check-invariants")
"""The plain bundled-model replicas that several end-to-end modules use, directly or behind their own
gateway; each step checks the block manager's invariants, as tests/engine/test_engine_real.py wants."""


SHARED_ENGINES = pytest.StashKey[list[ManagedProcess]]()
LAST_SHARED_ENGINES_USER = pytest.StashKey[pytest.Item | None]()


@pytest.fixture(scope="session")
def shared_real_engines(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ManagedProcess]]:
    """Two real SmolLM2 engines (`kvgate engine`) started once per run: each costs seconds of model
    loading, and the modules that use them need no flags of their own. Use ``real_engines``. They
    stop after the last test that uses them (each holds ~2 GB), not at the end of the run; under
    pytest-xdist a worker that does not run that test stops its own pair at its end."""
    from tests.gateway_cluster import running, start_engine_set

    folder = tmp_path_factory.mktemp("shared-real-engines")
    with running(start_engine_set(folder, [SHARED_ENGINE_FLAGS, SHARED_ENGINE_FLAGS])) as engines:
        request.session.stash[SHARED_ENGINES] = engines
        yield engines


def pytest_collection_finish(session: pytest.Session) -> None:
    users = [item for item in session.items if "shared_real_engines" in getattr(item, "fixturenames", ())]
    session.stash[LAST_SHARED_ENGINES_USER] = users[-1] if users else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    if item is item.session.stash.get(LAST_SHARED_ENGINES_USER, None):
        for engine in item.session.stash.get(SHARED_ENGINES, []):
            engine.stop()


@pytest.fixture(scope="module")
def real_engines(shared_real_engines: list[ManagedProcess]) -> list[ManagedProcess]:
    """The shared engines with empty prefix caches (and no session retained) for this module, so that
    no earlier module's prompts are hits; counters keep counting, so read them as differences."""
    for engine in shared_real_engines:
        assert engine.proc.poll() is None, f"a shared engine exited:\n{engine.log()[-3000:]}"
        assert http("POST", f"{engine.url}/reset_prefix_cache", b"").status == 200
    return shared_real_engines
