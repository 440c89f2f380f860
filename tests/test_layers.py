"""No import runs back up the layers (an AST walk over the source; nothing is imported or run).

    bench
    gateway   engine        (neither imports the other)
    planner
    normalize   radix       (neither imports the other)
    protocol                (wire contracts shared by gateway and engine: imports no kvgate package)

The bottom packages may import a package below them and nothing else: ``planner`` reads model
files through ``normalize``; ``normalize`` and ``radix`` may use the wire contracts of
``protocol``. Imports under ``if TYPE_CHECKING:`` count too: a type is a dependency.

Inside the gateway, only the app factory (``gateway/app.py``) and modules of request handlers
(an ``async def`` taking a ``web.Request``) import the composition root, ``gateway/state.py``;
every other part gets the parts it reads passed in.
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


COMPOSITION_ROOT = "gateway.state"
APP_FACTORY = "gateway/app.py"


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
        if str(path.relative_to(root)) != APP_FACTORY
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
    (tmp_path / "gateway" / "collector.py").write_text("from gateway.state import GATEWAY\n")
    (tmp_path / "gateway" / "routes.py").write_text(
        "from aiohttp import web\nfrom gateway.state import GATEWAY\n\n"
        "async def handle(request: web.Request) -> web.Response:\n    return web.json_response(request.app[GATEWAY])\n"
    )
    assert composition_root_importers(tmp_path) == ["gateway/collector.py"]


def test_the_walk_finds_upward_imports(tmp_path: Path) -> None:
    """The check can fail: imports up the layers, sideways and under an ``if`` are all seen."""
    (tmp_path / "radix").mkdir()
    (tmp_path / "radix" / "bad.py").write_text(
        "import os\nfrom radix.hashing import block_hashes\nif True:\n    from gateway.state import GATEWAY\n"
    )
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "bad.py").write_text("import gateway.config as config\nfrom planner import load\n")
    assert upward_imports(tmp_path) == ["engine/bad.py imports gateway.config", "radix/bad.py imports gateway.state"]
