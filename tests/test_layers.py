"""No import runs back up the layers (an AST walk over the source; nothing is imported or run).

    bench
    gateway   engine        (neither imports the other)
    planner
    normalize   radix       (neither imports the other)
    protocol                (wire contracts shared by gateway and engine: imports no kvgate package)

The bottom packages may import a package below them and nothing else: ``planner`` reads model
files through ``normalize``; ``normalize`` and ``radix`` may use the wire contracts of
``protocol``. Imports under ``if TYPE_CHECKING:`` count too: a type is a dependency.

Inside the gateway, only the app factories (``gateway/wiring/app.py`` and its ``/admin`` sub-app's
``gateway/admin/app.py``; the endpoint picker's ``gateway/epp/server.py``) and modules of request handlers
(an ``async def`` taking a ``web.Request``) import the composition root, ``gateway/wiring/state.py``;
every other part gets the parts it reads passed in.

No product module imports itself back through any chain of imports (``TYPE_CHECKING`` included):
the module graph has no cycle.
"""

import ast
from pathlib import Path

from tests.procs import REPO

BOTTOM = {"normalize", "radix", "protocol"}
ALLOWED: dict[str, set[str]] = {
    "bench": {"gateway", "engine", "planner", *BOTTOM},
    "gateway": {"planner", *BOTTOM},
    "engine": {"planner", *BOTTOM},
    "planner": BOTTOM,
    "normalize": {"protocol"},
    "radix": {"protocol"},
    "protocol": set(),
}
"""For each package, the kvgate packages it may import."""


def imported_modules(path: Path) -> set[str]:
    """Absolute module names this file imports (relative imports stay inside their package)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return modules


def module_name(path: Path, root: Path) -> str:
    """The dotted module name of a source file (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_targets(path: Path, root: Path, modules: set[str]) -> set[str]:
    """Product modules this file imports, relative imports and ``from package import module`` resolved."""
    package = module_name(path.parent / "__init__.py", root)
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        targets.update(name for name in names if name in modules)
    return targets


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Each product module and the product modules it imports (itself excluded)."""
    paths = {module_name(path, root): path for package in ALLOWED for path in sorted((root / package).rglob("*.py"))}
    modules = set(paths)
    return {name: imported_targets(path, root, modules) - {name} for name, path in paths.items()}


def import_cycles(root: Path = REPO) -> list[list[str]]:
    """Every strongly connected component of more than one module in the import graph (Tarjan), sorted."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = lowlink[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                lowlink[node] = min(lowlink[node], lowlink[target])
            elif target in on_stack:
                lowlink[node] = min(lowlink[node], index[target])
        if lowlink[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def upward_imports(root: Path = REPO) -> list[str]:
    """``file imports module`` for every import of a kvgate package its own package may not import."""
    found = []
    for package, allowed in ALLOWED.items():
        for path in sorted((root / package).rglob("*.py")):
            for module in sorted(imported_modules(path)):
                target = module.split(".")[0]
                if target in ALLOWED and target != package and target not in allowed:
                    found.append(f"{path.relative_to(root)} imports {module}")
    return found


ENGINE_LAYERS: dict[str, set[str]] = {
    "model": set(),
    "sim": {"model"},
    "core": {"model", "sim"},
    "server": {"model", "sim", "core"},
}
"""Inside ``engine/``: the model and the cost model compute a step, the core schedules over either,
the server serves the core; none imports back up."""


def upward_engine_imports(root: Path = REPO) -> list[str]:
    """``file imports module`` for every import of an engine sub-package its own may not import."""
    found = []
    for package, allowed in ENGINE_LAYERS.items():
        for path in sorted((root / "engine" / package).rglob("*.py")):
            for module in sorted(imported_modules(path)):
                parts = module.split(".")
                target = parts[1] if parts[0] == "engine" and len(parts) > 1 else None
                if target in ENGINE_LAYERS and target != package and target not in allowed:
                    found.append(f"{path.relative_to(root)} imports {module}")
    return sorted(found)


COMPOSITION_ROOT = "gateway.wiring.state"
APP_FACTORIES = {"gateway/wiring/app.py", "gateway/admin/app.py", "gateway/epp/server.py"}
"""The HTTP gateway's app factory, its ``/admin`` sub-app's, and the endpoint picker's composition root."""


def serves_requests(path: Path) -> bool:
    """Whether the module defines a request handler: an ``async def`` whose first argument is a ``web.Request``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.AsyncFunctionDef) and node.args.args:
            annotation = node.args.args[0].annotation
            if annotation is not None and ast.unparse(annotation) in {"web.Request", "Request"}:
                return True
    return False


def composition_root_importers(root: Path = REPO) -> list[str]:
    """Modules other than the app factory and request handlers that import the composition root."""
    return [
        str(path.relative_to(root))
        for path in sorted((root / "gateway").rglob("*.py"))
        if str(path.relative_to(root)) not in APP_FACTORIES
        and any(
            module == COMPOSITION_ROOT or module.startswith(f"{COMPOSITION_ROOT}.") for module in imported_modules(path)
        )
        and not serves_requests(path)
    ]


def test_every_package_is_in_the_layer_map() -> None:
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")} - {"tests"}
    assert packages == set(ALLOWED)


def test_no_import_runs_up_the_layers() -> None:
    assert upward_imports() == []


def test_only_the_app_factory_and_request_handlers_import_the_composition_root() -> None:
    assert composition_root_importers() == []


def test_the_walk_finds_a_part_that_reaches_into_the_composition_root(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "collector.py").write_text("from gateway.wiring.state import GATEWAY\n")
    (tmp_path / "gateway" / "routes.py").write_text(
        "from aiohttp import web\nfrom gateway.wiring.state import GATEWAY\n\n"
        "async def handle(request: web.Request) -> web.Response:\n    return web.json_response(request.app[GATEWAY])\n"
    )
    assert composition_root_importers(tmp_path) == ["gateway/collector.py"]


def test_the_walk_finds_upward_imports(tmp_path: Path) -> None:
    """The check can fail: imports up the layers, sideways and under an ``if`` are all seen."""
    (tmp_path / "radix").mkdir()
    (tmp_path / "radix" / "bad.py").write_text(
        "import os\nfrom radix.hashing import block_hashes\nif True:\n    from gateway.wiring.state import GATEWAY\n"
    )
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "bad.py").write_text("import gateway.config as config\nfrom planner import load\n")
    assert upward_imports(tmp_path) == [
        "engine/bad.py imports gateway.config",
        "radix/bad.py imports gateway.wiring.state",
    ]


def test_engine_sub_packages_import_only_down() -> None:
    assert upward_engine_imports() == []


def test_the_walk_finds_an_engine_core_module_reaching_into_the_server(tmp_path: Path) -> None:
    (tmp_path / "engine" / "core").mkdir(parents=True)
    (tmp_path / "engine" / "model").mkdir(parents=True)
    (tmp_path / "engine" / "core" / "loop.py").write_text(
        "from engine.server.metrics import M\nfrom engine.model import x\n"
    )
    (tmp_path / "engine" / "model" / "runner.py").write_text("import engine.core.loop\n")
    assert upward_engine_imports(tmp_path) == [
        "engine/core/loop.py imports engine.server.metrics",
        "engine/model/runner.py imports engine.core.loop",
    ]


def test_no_import_cycle() -> None:
    assert import_cycles() == []


def test_the_walk_finds_an_import_cycle_through_type_checking(tmp_path: Path) -> None:
    """The check can fail: a cycle closed by a relative import under ``TYPE_CHECKING`` is seen."""
    (tmp_path / "gateway" / "admission").mkdir(parents=True)
    (tmp_path / "gateway" / "__init__.py").write_text("")
    (tmp_path / "gateway" / "admission" / "__init__.py").write_text("")
    (tmp_path / "gateway" / "admission" / "limiter.py").write_text("from gateway.admission import tenants\n")
    (tmp_path / "gateway" / "admission" / "tenants.py").write_text("from .local_limiter import LocalLimiter\n")
    (tmp_path / "gateway" / "admission" / "local_limiter.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.admission.limiter import Limiter\n"
    )
    (tmp_path / "gateway" / "admission" / "queue.py").write_text("from gateway.admission.tenants import Tenant\n")
    assert import_cycles(tmp_path) == [
        ["gateway.admission.limiter", "gateway.admission.local_limiter", "gateway.admission.tenants"]
    ]
