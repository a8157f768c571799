"""The runnable blocks of the documentation's pages: each fenced ```bash block right after a
`<!-- run: GROUP -->` comment (invisible on the rendered page), read from the Markdown with
markdown-it-py, and run as a reader runs them: in the page's order, from the repository's root,
in one shell whose environment and directory carry from one group to the next (a page's groups
may run in different fixtures: the local cluster's is started by the session's fixture and used
by the page's own test)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

from tests.support.cli import cli_env
from tests.support.paths import REPO

DOCS = REPO / "docs"
MARK = re.compile(r"<!--\s*run:\s*([a-z][a-z0-9-]*)\s*-->")
# What looks like a run mark (a mistyped one would otherwise run nothing, silently).
MAYBE = re.compile(r"<!--\s*run\b", re.IGNORECASE)


@dataclass(frozen=True)
class Block:
    """A runnable block: its group, its first line on the page (1-based) and its text."""

    group: str
    line: int
    code: str


def blocks(page: Path) -> list[Block]:
    """The page's runnable blocks, in order. A mark followed by anything but a ```bash block
    is an error of the page (it would run nothing)."""
    found, mark = [], None
    for token in MarkdownIt("commonmark").parse(page.read_text()):
        if mark is not None:
            where = f"{page.name}:{mark[1]}"
            assert token.type == "fence" and token.info.strip() == "bash", (
                f"{where}: a run mark must precede a ```bash block"
            )
            assert token.map is not None
            found.append(Block(mark[0], token.map[0] + 2, token.content))
            mark = None
        elif token.type == "html_block" and MAYBE.search(token.content):
            assert token.map is not None
            m = MARK.fullmatch(token.content.strip())
            assert m, f"{page.name}:{token.map[0] + 1}: a run mark is <!-- run: GROUP -->"
            mark = (m.group(1), token.map[0] + 1)
    return found


def commands(code: str) -> list[str]:
    """A block's command lines: comments dropped, continued lines joined."""
    joined = re.sub(r"\\\n\s*", "", code)
    return [line.split("  #", 1)[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip


def groups(page: Path) -> list[str]:
    """The page's groups in the order a reader meets them (a group's blocks may be apart)."""
    return list(dict.fromkeys(b.group for b in blocks(page)))


@dataclass
class Terminal:
    """One reader's shell: ``env`` and ``cwd`` as the last group left them."""

    env: dict[str, str] = field(default_factory=lambda: reader_env())
    cwd: Path = REPO

    def run(self, page: Path, group: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``group``'s blocks of ``page`` in bash (-e: the first failing command fails the
        group; stderr names each block's page and line before it runs)."""
        chosen = [b for b in blocks(page) if b.group == group]
        assert chosen, f"{page.name} has no block of group {group!r}"
        with tempfile.TemporaryDirectory() as tmp:
            env_file, cwd_file = Path(tmp) / "env", Path(tmp) / "cwd"
            script = ["set -euo pipefail"]
            for block in chosen:
                where = shlex.quote(f"{label(page)}:{block.line}")
                script += [f"echo '>>>' {where} >&2", block.code]
            script += [f"env -0 > {shlex.quote(str(env_file))}",
                       f"pwd > {shlex.quote(str(cwd_file))}"]  # fmt: skip
            done = run_group(["bash", "-c", "\n".join(script)], self.cwd, self.env, timeout)
            if done.returncode == 0:
                pairs = env_file.read_text().split("\0")
                self.env = dict(p.split("=", 1) for p in pairs if "=" in p)
                self.cwd = Path(cwd_file.read_text().strip())
        return done


def run_group(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a group's shell in its own session: past ``timeout`` the whole group (the shell and
    whatever it started) is killed, by its process group, and the timeout raised."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def reader_env() -> dict[str, str]:
    """The environment a reader starts from: this one (HOME, the caches' variables), without
    what the suite set for its own processes: the venv's and the tools' PATH entries and a
    KUBECONFIG (a page activates, exports and adds what it needs)."""
    env = cli_env()
    env.pop("KUBECONFIG", None)
    env.pop("VIRTUAL_ENV", None)
    ours = {str(REPO / ".venv" / "bin"), str(REPO / ".tools" / "bin")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p not in ours)
    return env


def label(page: Path) -> str:
    """How stderr names a page: from the repository's root (a test's own page: as given)."""
    return str(page.relative_to(REPO) if page.is_relative_to(REPO) else page)


def by_block(stderr: str, page: Path) -> dict[int, str]:
    """A group's stderr cut at each block's marker: the block's first line -> what it wrote."""
    marker = f">>> {label(page)}:"
    chunks = stderr.split(marker)[1:]
    return {int(c.split("\n", 1)[0]): c.split("\n", 1)[-1] for c in chunks}


def failed(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed group printed, for an assertion's message."""
    return f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
