"""Processes that must not outlive their parent (gpufleet.launch.orphans), found by command line
(launch.mpi_worker), started once their peers answer (launch.mpi_launcher), ended on a signal, a
lost host or an interrupted launcher, and the ranks' logs a launcher keeps as it exits: real
processes, started and ended here by pid."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path

import psutil
import pytest

from gpufleet.errors import EXIT_PREEMPTED
from gpufleet.launch import keptlogs, local, orphans, pod
from gpufleet.launch.keptlogs import kept_name
from gpufleet.launch.local import forward_signals
from gpufleet.launch.mpi_launcher import ENV_HOSTFILE
from gpufleet.launch.mpi_launcher import main as mpi_launcher_main
from gpufleet.launch.mpi_worker import launchers
from gpufleet.launch.mpi_worker import main as mpi_worker_main
from gpufleet.launch.node import NodeConfig
from gpufleet.procs import pid_alive
from tests.support.procs import poll_until

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
    """SIGUSR1 to this process recorded (sent in place of SIGKILL); its death signal put back."""
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


# A worker forked by the forkserver: releases its copy of the pipe and reports, then waits.
RELEASE = textwrap.dedent("""
    import os
    from multiprocessing import forkserver
    from gpufleet.launch.orphans import release_forkserver
    server = forkserver._forkserver
    fd = server._forkserver_alive_fd
    release_forkserver()
    closed = not os.path.exists(f"/proc/self/fd/{fd}")
    conn.send((fd is not None, closed, server._forkserver_alive_fd, server._forkserver_address))
    conn.recv()
""")


def test_a_released_worker_lets_its_forkserver_end_with_the_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = forkserver.ForkServer()  # this test's own, with nothing to preload
    server.set_forkserver_preload([])
    for name in ("ensure_running", "connect_to_new_process", "get_inherited_fds"):
        monkeypatch.setattr(forkserver, name, getattr(server, name))
    monkeypatch.setattr(forkserver, "_forkserver", server)
    ctx = multiprocessing.get_context("forkserver")
    ours, theirs = ctx.Pipe()
    worker = ctx.Process(target=exec, args=(RELEASE, {"conn": theirs}))
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
    with subprocess.Popen([sys.executable, "-c", NAMED, marker], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:  # fmt: skip
        try:  # its cmdline is empty a moment after exec: look once it runs
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            assert launchers(os.getuid(), marker) == [child.pid]
            assert launchers(os.getuid() + 1, marker) == []  # another user's are not ours
        finally:
            child.communicate("", timeout=30)


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


def test_an_mpi_worker_without_sshd_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert mpi_worker_main([]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m gpufleet.launch.mpi_worker SSHD")


def test_an_mpi_worker_exits_with_its_sshds_code() -> None:
    assert mpi_worker_main(["sh", "-c", "exit 7"]) == 7


def test_a_signal_to_the_launcher_reaches_each_running_node_as_sigterm() -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    procs = [subprocess.Popen(["sleep", "30"]), done, subprocess.Popen(["sleep", "30"])]

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # not pytest's: a miss fails this test only
    try:
        with forward_signals(procs):  # type: ignore[arg-type]
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            codes = [p.wait(timeout=10) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert codes == [-signal.SIGTERM, 0, -signal.SIGTERM]  # agents take SIGTERM as "checkpoint"
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # put back


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


def test_the_ranks_logs_are_kept_once_beside_the_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = tmp_path / "logs" / "train_x1" / "attempt_0" / "0"
    rank.mkdir(parents=True)
    (rank / "stderr.log").write_text("err\n")
    monkeypatch.delenv("GPUFLEET_CHECKPOINT_DURABLE", raising=False)
    monkeypatch.delenv("GPUFLEET_CHECKPOINT_DIR", raising=False)
    pod._keeper(str(tmp_path / "logs"), 0.0)()  # no checkpoint directory: nowhere to keep them
    monkeypatch.setenv("GPUFLEET_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    pod._keeper(None, 0.0)()  # a --log-dir of the command line's: not ours to copy
    assert not (tmp_path / "ckpt").exists()
    started = 1_700_000_000.25
    keep = pod._keeper(str(tmp_path / "logs"), started)
    host_watch = threading.Thread(target=keep)  # the host watch's thread sets no handler
    host_watch.start()
    host_watch.join()
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    kept = tmp_path / "ckpt" / "logs" / kept_name(started, socket.gethostname())
    assert (kept / "train_x1" / "attempt_0" / "0" / "stderr.log").read_text() == "err\n"
    shutil.rmtree(kept)
    keep()  # once only
    assert not kept.exists()
    pod._keeper(str(tmp_path / "logs"), started)()  # the main thread: SIGTERM ignored meanwhile
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN and kept.is_dir()


def test_kept_logs_that_take_too_long_are_one_line_and_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "stderr.log").write_text("err\n")
    release = threading.Event()
    monkeypatch.setattr(keptlogs, "_copy", lambda *_: release.wait(30))  # a storage that hangs
    try:
        assert keptlogs.keep(tmp_path / "logs", str(tmp_path / "ckpt"), "pod-0", 0.05) is None
    finally:
        release.set()
    dest = f"{tmp_path}/ckpt/logs/pod-0"
    assert (
        capsys.readouterr().err
        == f"gpufleet: could not keep the ranks' logs in {dest}: not done in 0 s\n"
    )


def test_a_log_directory_that_cannot_be_read_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unreadable(*_: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(keptlogs.Path, "rglob", unreadable)
    assert keptlogs.keep(tmp_path, str(tmp_path / "ckpt"), "pod-0") is None
    monkeypatch.undo()
    assert capsys.readouterr().err.endswith(": [Errno 13] Permission denied\n")
    assert not (tmp_path / "ckpt").exists()


def test_an_mpi_launcher_without_a_command_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--"], ["--wait", "1"]):
        with pytest.raises(SystemExit) as exit_:
            mpi_launcher_main(argv)
        assert exit_.value.code == 2
        assert capsys.readouterr().err.rstrip().endswith("error: no command (mpirun ...) after --")


@pytest.mark.parametrize("hostfile", [None, "# slots for none yet\n"])
def test_without_workers_to_wait_for_mpirun_starts_at_once(
    tmp_path: Path, hostfile: str | None
) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_HOSTFILE}
    if hostfile is not None:
        (tmp_path / "hostfile").write_text(hostfile)
        env[ENV_HOSTFILE] = str(tmp_path / "hostfile")
    done = subprocess.run([sys.executable, "-m", "gpufleet.launch.mpi_launcher", "--wait", "30",
                           "--", "sh", "-c", "echo ran as $0", "mpirun"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran as mpirun\n", "")


def test_an_interrupted_launcher_kills_its_node_agents_and_no_secret_is_in_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[subprocess.Popen[bytes], str, bytes]] = []

    def interrupted(proc: subprocess.Popen[bytes]) -> int:  # Ctrl-C while the launcher waits
        config = (tmp_path / "nodes" / "node0.json").read_text()
        assert not (tmp_path / "nodes" / "node0.out.json").exists()  # the stale one cleared
        environ = poll_until(  # empty a moment after exec
            lambda: Path(f"/proc/{proc.pid}/environ").read_bytes(), what="the agent's environ",
            timeout=20, interval=0.02,
        )  # fmt: skip
        seen.append((proc, config, environ))
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "wait_exit", interrupted)
    node = NodeConfig(run_id="r", node_rank=0, nnodes=1, nproc_per_node=1, max_restarts=0,
                      rdzv_endpoint="127.0.0.1:1", shutdown_timeout=1, log_dir=str(tmp_path),
                      argv=["true"], env={}, secret_env={"HF_TOKEN": "s3cr3t"})  # fmt: skip
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "node0.out.json").write_text("{}")  # a SIGKILLed launch's, cleared
    with pytest.raises(KeyboardInterrupt):
        local._launch_node_processes([node], tmp_path / "nodes")
    ((agent, config, environ),) = seen
    assert agent.wait(timeout=30) == -signal.SIGKILL
    assert "s3cr3t" not in config and b"\0HF_TOKEN=s3cr3t\0" in environ  # its environment only
    assert not (tmp_path / "nodes").exists()  # its config files removed
