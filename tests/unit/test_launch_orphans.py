"""Processes that must not outlive their parent (gpufleet.launch.orphans), found by command line
(gpufleet.launch.mpi_worker), ended on a signal (local.forward_signals) or on a lost host
(pod._lost_host): real processes, started and ended here by pid."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path

import psutil
import pytest

from gpufleet.errors import EXIT_PREEMPTED
from gpufleet.launch import orphans
from gpufleet.launch.local import forward_signals
from gpufleet.launch.mpi_worker import launchers
from gpufleet.launch.mpi_worker import main as mpi_worker_main
from gpufleet.procs import pid_alive

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2
NO_SUCH_PID = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # above every pid


def death_signal() -> int:
    """This process's PR_SET_PDEATHSIG signal, read back from the kernel."""
    value = ctypes.c_int(0)
    assert _LIBC.prctl(_PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0) == 0
    return value.value


def wait_gone(pid: int, limit: float = 20.0) -> bool:
    """Whether ``pid`` ended (a zombie counts as ended) within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not pid_alive(pid)


@pytest.fixture
def caught() -> Iterator[list[int]]:
    """SIGUSR1 sent to this process recorded instead of acted on (the functions under test send
    it in place of SIGKILL); this process's death signal put back afterwards."""
    got: list[int] = []
    before = death_signal()
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGUSR1, previous)
        _LIBC.prctl(_PR_SET_PDEATHSIG, before, 0, 0, 0)


def test_with_its_agent_as_parent_only_the_death_signal_is_armed(caught: list[int]) -> None:
    orphans.die_with_parent(signal.SIGUSR1, expected_parent=os.getppid())
    assert caught == []
    assert death_signal() == signal.SIGUSR1


def test_a_process_whose_agent_is_already_gone_signals_itself(caught: list[int]) -> None:
    orphans.die_with_parent(signal.SIGUSR1, expected_parent=NO_SUCH_PID)
    assert caught == [signal.SIGUSR1]
    assert death_signal() == signal.SIGUSR1  # armed all the same


def test_a_parent_dying_during_the_call_is_noticed(
    caught: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parent dies between the first getppid and prctl: the child is reparented (to 1).
    parents = iter([os.getppid(), 1])
    monkeypatch.setattr(orphans.os, "getppid", lambda: next(parents))
    orphans.die_with_parent(signal.SIGUSR1)
    assert caught == [signal.SIGUSR1]


def test_a_signal_the_kernel_refuses_leaves_the_death_signal_as_it_was(caught: list[int]) -> None:
    before = death_signal()
    orphans.die_with_parent(200)  # no such signal: prctl fails with EINVAL
    assert death_signal() == before
    assert caught == []


def test_a_forked_worker_checks_its_grandparent(caught: list[int]) -> None:
    grandparent = psutil.Process(os.getppid()).ppid()
    orphans.die_with_grandparent(grandparent, signal.SIGUSR1)
    assert caught == []
    assert death_signal() == signal.SIGUSR1
    orphans.die_with_grandparent(NO_SUCH_PID, signal.SIGUSR1)  # the agent died before this
    assert caught == [signal.SIGUSR1]


def test_off_linux_nothing_is_armed_or_renamed(
    caught: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    before, comm = death_signal(), Path("/proc/self/comm").read_text()
    monkeypatch.setattr(orphans.sys, "platform", "darwin")
    orphans.die_with_parent(signal.SIGUSR1, expected_parent=NO_SUCH_PID)
    orphans.die_with_grandparent(NO_SUCH_PID, signal.SIGUSR1)
    orphans.name_process("renamed")
    monkeypatch.undo()
    assert caught == []
    assert (death_signal(), Path("/proc/self/comm").read_text()) == (before, comm)


NAMED = textwrap.dedent("""
    import sys
    from gpufleet.launch.orphans import name_process
    name_process(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_a_renamed_child_is_found_under_its_parent_whatever_its_name() -> None:
    name = "x) y (gpufleet-rank12"  # a ")" in the name must not confuse /proc/<pid>/stat's parse
    with subprocess.Popen([sys.executable, "-c", NAMED, name], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:  # fmt: skip
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            comm = Path(f"/proc/{child.pid}/comm").read_text().rstrip("\n")
            assert comm == name.encode()[:15].decode()  # Linux keeps 15 bytes
            assert orphans._parent_of(child.pid) == os.getpid()
        finally:
            child.communicate("", timeout=30)
    assert child.returncode == 0
    assert orphans._parent_of(NO_SUCH_PID) is None


def _release_and_report(conn: object) -> None:  # a worker forked by the forkserver
    server = forkserver._forkserver
    fd = server._forkserver_alive_fd  # type: ignore[attr-defined]
    orphans.release_forkserver()
    try:
        os.fstat(fd)
        closed = False
    except OSError:
        closed = True
    alive, address = server._forkserver_alive_fd, server._forkserver_address  # type: ignore[attr-defined]
    conn.send((fd is not None, closed, alive, address))  # type: ignore[attr-defined]
    conn.recv()  # type: ignore[attr-defined]  # stays alive until told


def test_a_released_worker_lets_its_forkserver_end_with_the_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import multiprocessing

    server = forkserver.ForkServer()  # this test's own, with nothing to preload
    for name in ("ensure_running", "connect_to_new_process", "get_inherited_fds"):
        monkeypatch.setattr(forkserver, name, getattr(server, name))
    monkeypatch.setattr(forkserver, "_forkserver", server)
    ctx = multiprocessing.get_context("forkserver")
    ours, theirs = ctx.Pipe()
    worker = ctx.Process(target=_release_and_report, args=(theirs,))
    worker.start()
    try:
        assert ours.recv() == (True, True, None, None)
        # The agent's end of the "alive" pipe closes (the agent died): the server leaves its
        # loop though its worker still runs, as it would not with the worker's copy open.
        os.close(server._forkserver_alive_fd)  # type: ignore[attr-defined]
        assert wait_gone(server._forkserver_pid)  # type: ignore[attr-defined]
        assert pid_alive(worker.pid or 0)
    finally:
        ours.send("bye")
        os.waitpid(server._forkserver_pid, 0)  # type: ignore[attr-defined]
        server._forkserver_alive_fd = server._forkserver_pid = None  # type: ignore[attr-defined]
    assert wait_gone(worker.pid or 0)


def test_a_process_no_forkserver_forked_keeps_the_servers_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = forkserver.ForkServer()
    server._forkserver_address = "/tmp/listener"  # type: ignore[attr-defined]
    monkeypatch.setattr(forkserver, "_forkserver", server)
    orphans.release_forkserver()
    assert server._forkserver_address == "/tmp/listener"  # type: ignore[attr-defined]


def test_pod_launchers_are_found_by_command_line_among_this_users_processes() -> None:
    marker = f"gpufleet-test-{uuid.uuid4().hex}"
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", marker],
                          stdin=subprocess.PIPE) as child:  # fmt: skip
        try:
            assert launchers(os.getuid(), marker) == [child.pid]
            assert launchers(os.getuid() + 1, marker) == []  # another user's are not ours
        finally:
            child.communicate(b"", timeout=30)


def test_launchers_skip_this_process_and_entries_that_cannot_be_read(tmp_path: Path) -> None:
    for name, cmdline in ((str(os.getpid()), b"python\0-m\0gpufleet.launch.pod\0"),
                          ("4242", b"python\0-m\0gpufleet.launch.pod\0"),
                          ("4243", b"sshd\0-D\0"), ("self", b"gpufleet.launch.pod")):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "cmdline").write_bytes(cmdline)
    (tmp_path / "4244").mkdir()  # gone meanwhile: no cmdline to read
    found = launchers(os.getuid(), proc=tmp_path)
    assert found == [4242]
    assert launchers(os.getuid() + 1, proc=tmp_path) == []


@pytest.fixture
def handlers_kept() -> Iterator[None]:
    """SIGTERM's and SIGINT's handlers of this process as they were, whatever the test sets."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_an_mpi_worker_without_sshd_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], handlers_kept: None
) -> None:
    assert mpi_worker_main([]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m gpufleet.launch.mpi_worker SSHD")


def test_an_mpi_worker_exits_with_its_sshds_code(handlers_kept: None) -> None:
    assert mpi_worker_main(["sh", "-c", "exit 7"]) == 7


def test_a_signal_to_the_launcher_reaches_each_running_node_as_sigterm(handlers_kept: None) -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    procs = [subprocess.Popen(["sleep", "30"]), done, subprocess.Popen(["sleep", "30"])]
    before = signal.getsignal(signal.SIGINT)
    try:
        with forward_signals(procs):  # type: ignore[arg-type]
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the handler runs, not KeyboardInterrupt
            codes = [p.wait(timeout=30) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert codes == [-signal.SIGTERM, 0, -signal.SIGTERM]  # agents take SIGTERM as "checkpoint"
    assert signal.getsignal(signal.SIGINT) is before


LOST_HOST = textwrap.dedent("""
    import subprocess, sys
    from pathlib import Path
    from gpufleet.launch.pod import _lost_host

    worker = subprocess.Popen(["sleep", "30"])
    print(worker.pid, flush=True)
    lost = _lost_host("train-0.train:29400", lambda: Path(sys.argv[1]).write_text("kept"))
    lost("no reply in 30 s")
    print("not reached", flush=True)
""")


def test_a_lost_rendezvous_host_ends_the_workers_keeps_the_logs_and_exits_75(
    tmp_path: Path,
) -> None:
    kept = tmp_path / "kept"
    done = subprocess.run([sys.executable, "-c", LOST_HOST, str(kept)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == EXIT_PREEMPTED
    worker_pid, *rest = done.stdout.split()
    assert rest == []  # it exited inside lost()
    assert wait_gone(int(worker_pid))
    assert kept.read_text() == "kept"
    assert done.stderr.strip() == (
        "gpufleet: lost the rendezvous host train-0.train:29400 after the group formed "
        f"(no reply in 30 s); exit {EXIT_PREEMPTED}: retry, the job resumes from its last "
        "checkpoint"
    )
