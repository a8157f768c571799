"""The project on its own: what a `git clone` gets (the tracked files, with this working tree's
changes), copied into an empty temporary directory with nothing beside it, passes the schema,
render, chart and golden tests; and no file of the project names a path outside it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

# The tests that read the custom-resource schemas and the goldens (each reads files of the repo).
STANDALONE_TESTS = (
    "tests/unit/test_render.py",
    "tests/unit/test_render_refusals.py",
    "tests/unit/test_render_launch.py",
    "tests/unit/test_serving_render.py",
    "tests/integration/test_chart.py",
    "tests/unit/test_goldens.py",
)


def _project_files() -> list[str]:
    """The files a clone of this working tree holds: tracked and new ones, not the ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [name for name in out.split("\0") if name and (REPO / name).exists()]


def test_no_file_names_a_path_outside_the_repository() -> None:
    # the shared folder beside a checkout, as a relative path or as Python builds it
    outside = re.compile(r"\.\./shared|parents?(\[\d\])? / ['\"]shared['\"]")
    hits = []
    for name in _project_files():
        if (REPO / name).is_symlink():
            continue
        try:
            text = (REPO / name).read_text()
        except (UnicodeDecodeError, OSError):  # a binary file (a PNG of results)
            continue
        hits += [f"{name}: {m.group()}" for m in outside.finditer(text)]
    assert not hits, hits


def test_schema_and_render_tests_pass_in_a_lone_clone(tmp_path: Path) -> None:
    clone = tmp_path / "gpufleet"  # tmp_path holds nothing else: no shared folder, no .tools
    for name in _project_files():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():  # as git checks it out (deploy/grafana)
            (clone / name).symlink_to(os.readlink(REPO / name))
        else:
            shutil.copy2(REPO / name, clone / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpufleet"]
    env = dict(os.environ, PYTHONPATH=str(clone / "src"), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *STANDALONE_TESTS],
        cwd=clone, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail, tail
