"""The public names of each package are the ones it lists and documents: ``__all__`` holds every
name its ``__init__`` re-exports or defines and nothing it does not bind, and each exported
function and class has a docstring of its own. A package that exports nothing has no ``__all__``."""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import REPO

SRC = REPO / "src"
INITS = sorted((SRC / "gpufleet").rglob("__init__.py"))


@dataclass(frozen=True)
class Exports:
    """What a package's ``__init__`` says and does about its public names."""

    package: str
    docstring: str
    listed: list[str] | None  # __all__, None without one
    bound: set[str]  # every name the module binds at top level (imports under TYPE_CHECKING too)
    offered: set[str]  # public names it defines, or imports from its own modules and never uses


def read_exports(init: Path) -> Exports:
    """Parse ``init`` (never import it: runtime's names are lazy, torch behind them)."""
    package = ".".join(init.parent.relative_to(SRC).parts)
    tree = ast.parse(init.read_text())
    listed: list[str] | None = None
    bound: set[str] = set()
    defined: set[str] = set()
    own_imports: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop(0)
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` imports for the lazy __getattr__
            statements[:0] = node.body
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            names = {alias.asname or alias.name for alias in node.names}
            bound |= names
            if (node.module or "").startswith(package + "."):
                own_imports |= names
        elif isinstance(node, ast.Import):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if "__all__" in names:
                assert node.value is not None
                listed = list(ast.literal_eval(node.value))
            bound |= names
            defined |= names
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    public = {name for name in defined | (own_imports - used) if not name.startswith("_")}
    return Exports(package, ast.get_docstring(tree) or "", listed, bound, public)


PACKAGES = [read_exports(init) for init in INITS]


def test_every_package_is_read() -> None:
    names = {p.package for p in PACKAGES}
    assert {"gpufleet", "gpufleet.spec", "gpufleet.render", "gpufleet.runtime"} <= names


@pytest.mark.parametrize("exports", PACKAGES, ids=lambda e: e.package)
def test_all_lists_exactly_what_the_package_exports(exports: Exports) -> None:
    if exports.listed is None:
        assert not exports.offered, (
            f"{exports.package} exports {sorted(exports.offered)}: list them in an __all__"
        )
        return
    assert len(exports.listed) == len(set(exports.listed)), f"{exports.package}: __all__ repeats"
    unlisted = exports.offered - set(exports.listed)
    assert not unlisted, f"{exports.package}: public names missing from __all__: {sorted(unlisted)}"
    unbound = set(exports.listed) - exports.bound
    assert not unbound, f"{exports.package}: __all__ names it never binds: {sorted(unbound)}"


def undocumented(obj: object, name: str) -> bool:
    """A function or class without a docstring of its own (a dataclass's generated
    ``Name(fields)`` or an inherited one does not count)."""
    doc = vars(obj).get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return not doc or doc.startswith(f"{name}(")


@pytest.mark.parametrize("exports", [p for p in PACKAGES if p.listed], ids=lambda e: e.package)
def test_every_exported_function_and_class_says_what_it_is(exports: Exports) -> None:
    """Constants are named in the docs or their module's comments; callables carry a docstring."""
    module = importlib.import_module(exports.package)
    assert exports.listed is not None
    missing = []
    for name in exports.listed:
        obj = getattr(module, name)
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and undocumented(obj, name):
            missing.append(name)
    assert not missing, f"{exports.package}: exported without a docstring: {missing}"
