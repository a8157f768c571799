"""The shape the style guide asks of the source (STYLE.md, habit 1): small modules with one job
and short functions. A function's length is its body's: a typer command's option declarations
are its signature, and literal object builders (a Deployment, a webhook probe) are long by
nature and say nothing more when cut, so the lines of multi-line literals are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

SRC = REPO / "src" / "gpufleet"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
LITERALS = (ast.Dict, ast.List, ast.Tuple, ast.Set)


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _literal_lines(node: ast.AST) -> set[int]:
    """Lines inside multi-line literals (dict, list, tuple, set displays) under ``node``."""
    lines: set[int] = set()
    for sub in ast.walk(node):
        if isinstance(sub, LITERALS) and sub.end_lineno and sub.end_lineno > sub.lineno:
            lines.update(range(sub.lineno + 1, sub.end_lineno + 1))
    return lines


def function_lengths(path: Path) -> dict[str, int]:
    """Each function's body lines (docstring included, multi-line literals not), by qualified
    name."""
    tree = ast.parse(path.read_text())
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                start = child.body[0].lineno
                span = set(range(start, (child.end_lineno or start) + 1))
                out[f"{prefix}{child.name}"] = len(span - _literal_lines(child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return out


def test_no_module_is_over_400_lines() -> None:
    """A module over 400 lines holds more than one job (split it by concern)."""
    long = {
        str(p.relative_to(SRC)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_is_over_60_lines_of_logic() -> None:
    """A function over 60 lines (its literals aside) does several things: give each a name."""
    long = {
        f"{p.relative_to(SRC)}:{name}": n
        for p in _modules()
        for name, n in function_lengths(p).items()
        if n > MAX_FUNCTION_LINES
    }
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_measure_counts_logic_and_skips_literals(tmp_path: Path) -> None:
    """The measure itself: a function's statements count, a long dict literal does not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(70))
    literal = "\n".join(f"        'k{i}': {i}," for i in range(70))
    src = tmp_path / "m.py"
    src.write_text(f"def long():\n{body}\n\n\ndef builder():\n    return {{\n{literal}\n    }}\n")
    lengths = function_lengths(src)
    assert lengths["long"] == 70
    assert lengths["builder"] == 1
