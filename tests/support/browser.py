"""A real browser for the dashboard's tests: Debian's Chromium (scripts/get-chromium.sh, `make
tools`) driven by Playwright, and `gpufleet dashboard` started as a user starts it.

Chromium runs headless with the flags a closed network needs (no background connections, no
component updates: each would be refused, many at a time) and a fresh profile. Screenshots of
each page go to ``ARTIFACTS`` (the test run's artifacts; docs/images/ holds one of each)."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.paths import REPO
from tests.support.procs import poll_until, stop_processes

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = REPO / ".gpufleet" / "artifacts" / "dashboard"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-quic"]  # fmt: skip


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if shutil.which(CHROMIUM) is None:
        return f"no {CHROMIUM}: make tools installs Debian's chromium (scripts/get-chromium.sh)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (the dev extra has it)"
    return None


needs_browser = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright Browser), closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    """The whole page as ``ARTIFACTS/<name>.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@contextlib.contextmanager
def dashboard(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``gpufleet dashboard --port 0 ARGS`` running; yields its URL (from its first line)."""
    log = cwd / "dashboard.log"
    with log.open("w") as out:
        argv = gpufleet_cmd("dashboard", "--port", "0", *args)
        proc = subprocess.Popen(argv, cwd=cwd, env=env or cli_env(), stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        found = poll_until(lambda: re.search(r"dashboard at (http://\S+)", log.read_text()),
                           what="the dashboard's URL", timeout=60)  # fmt: skip
        yield found.group(1).rstrip("/")
    finally:
        stop_processes([proc])
