"""One exception tree (httpx's ``_exceptions``): every error gpufleet raises on purpose is
defined in gpufleet.errors and drawn in its documented tree, with its exit code."""

from __future__ import annotations

import ast
import re

from gpufleet import errors
from tests.support.paths import REPO

SRC = REPO / "src" / "gpufleet"


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def test_every_gpufleet_error_lives_in_errors_and_is_in_its_tree() -> None:
    tree_names = {c.__name__ for c in _subclasses(errors.GpufleetError)}
    doc = errors.__doc__ or ""
    assert not [n for n in tree_names if f"── {n}" not in doc], "missing from the tree"
    outside = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "errors.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                if bases & (tree_names | {"GpufleetError"}):
                    outside.append(f"{path.relative_to(SRC)}:{node.name}")
    assert not outside, f"errors defined outside gpufleet.errors: {outside}"


def test_the_trees_exit_codes_are_the_classes_own() -> None:
    """The tree says ``exit N`` where a class sets its own code."""
    doc = errors.__doc__ or ""
    for cls in _subclasses(errors.GpufleetError):
        line = next(ln for ln in doc.splitlines() if f"── {cls.__name__} " in ln)
        if cls.exit_code != errors.EXIT_FAILED:
            assert f"exit {cls.exit_code}" in line, (cls.__name__, line)


# The exit codes that restart policies, scripts and docs key on, as literals: a changed constant
# fails here (mutation testing does not change module-level constants; docs/coverage.md).
EXIT_CODES = {
    "EXIT_OK": 0,
    "EXIT_FAILED": 1,
    "EXIT_BAD_INPUT": 2,
    "EXIT_HUNG": 3,
    "EXIT_NO_CHECKPOINT": 4,
    "EXIT_NON_FINITE": 5,
    "EXIT_STORAGE": 6,
    "EXIT_PREEMPTED": 75,
}
# Errors whose code is not 1 (EXIT_FAILED).
OWN_CODES = {
    "CheckpointMismatchError": 2,
    "CheckpointKeyError": 2,
    "ReshardError": 2,
    "UserInputError": 2,
    "NoUsableCheckpointError": 4,
    "NonFiniteError": 5,
    "CheckpointStorageError": 6,
}


def test_the_exit_codes_are_the_documented_numbers() -> None:
    """Every EXIT_ constant and error's code is the number docs/architecture.md gives it."""
    constants = {name: getattr(errors, name) for name in dir(errors) if name.startswith("EXIT_")}
    assert constants == EXIT_CODES
    own = {c.__name__: c.exit_code for c in _subclasses(errors.GpufleetError) if c.exit_code != 1}
    assert own == OWN_CODES
    section = (REPO / "docs" / "architecture.md").read_text().split("## Exit codes", 1)[1]
    section = section.split("\n## ", 1)[0]
    for code in EXIT_CODES.values():
        assert re.search(rf"(?<![\d+]){code} [a-z]", section), f"exit {code} not in the docs"
