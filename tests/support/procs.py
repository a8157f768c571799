"""Waiting on processes and servers: poll until ready, find and stop what a test started."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from gpufleet.launch.shim import WORKER_NAME

T = TypeVar("T")


def poll_until(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float = 120,
    interval: float = 0.2,
    alive: subprocess.Popen[Any] | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``check`` until it returns something truthy, and return that.

    Fails the test saying ``what`` was awaited when ``timeout`` seconds pass, or at once when
    the ``alive`` process has exited (a dead launcher makes no more progress; its exit code is
    in the message). Exceptions of the ``retry_on`` types count as "not yet" (a server that is
    not listening yet raises OSError).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except retry_on:
            value = None
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            pytest.fail(f"process exited with {alive.returncode} while waiting for {what}")
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def listeners_among(ports: dict[str, int], text: str, pids: Iterable[int] = ()) -> list[str]:
    """The names of ``ports`` that a live process listens on whose command line mentions
    ``text``, whose pid is among ``pids``, or that psutil cannot name. Another test's cluster
    may meanwhile listen on a port this one chose and freed, or never opened (a component left
    out with ``--without``): that is not ours (a CI run saw one)."""
    names, ours = {port: name for name, port in ports.items()}, set(pids)
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        port = conn.laddr.port if isinstance(conn.laddr, tuple) and conn.laddr else None
        if conn.status != psutil.CONN_LISTEN or port not in names:
            continue
        try:
            cmd = " ".join(psutil.Process(conn.pid).cmdline()) if conn.pid else text
        except psutil.NoSuchProcess:
            continue
        if text in cmd or conn.pid in ours:
            found.append(f"{names[port]} (port {port}, pid {conn.pid})")
    return found


def processes_mentioning(text: str, cwd: Path | None = None) -> list[psutil.Process]:
    """Live processes whose command line or working directory mentions ``text``; with ``cwd``,
    only those working there (read once in the listing: another test's processes come and go)."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd, where = " ".join(p.info["cmdline"] or []), p.info["cwd"] or ""
            mentions = text in cmd or text == where
            if p.pid != os.getpid() and mentions and (cwd is None or where == str(cwd)):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def workers_in(cwd: Path) -> list[psutil.Process]:
    """The training workers working in ``cwd``: forked by their agent's forkserver, they carry
    its command line and the name ``gpufleet-rank<RANK>`` (gpufleet.launch.forked)."""
    return [p for p in processes_mentioning(str(cwd), cwd=cwd)
            if _name(p).startswith(WORKER_NAME)]  # fmt: skip


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def wait_no_processes(text: str, timeout: float = 15) -> list[psutil.Process]:
    """Wait until no process mentions ``text``; return the ones left after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = processes_mentioning(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_mentioning(text)
    return left


def stop_processes(procs: list[subprocess.Popen[Any]], timeout: float = 30) -> None:
    """SIGTERM each process still running (last started first), then wait; SIGKILL laggards.
    Pipes to them are closed."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


SHM = Path("/dev/shm")


def semaphores_of(pid: int) -> set[str]:
    """The POSIX named semaphores (their /dev/shm names) that process ``pid`` and its
    descendants map, in whichever /dev/shm each of them sees (torch's workers have sessions of
    their own, so not by process group)."""
    names: set[str] = set()
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return names
    for proc in procs:
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
        except OSError:  # gone, or not ours to read
            continue
        names |= set(re.findall(r"/dev/shm/(sem\.[^\s]+)", maps))
    return names
