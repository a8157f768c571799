"""The worker shim (gpufleet.launch.shim) and the forked workers' entry point (launch.forked):
the user's script or module run as Python would, a lost peer and a fatal gpufleet error each one
line and an exit code, a TensorFlow worker's TF_CONFIG and scratch directory, the shim as a
process of its own, and what a worker here ignores of the spec."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import DistError
from torch.distributed import distributed_c10d as c10d
from torch.multiprocessing.spawn import ProcessExitedException

from gpufleet.errors import EXIT_BAD_INPUT, EXIT_HUNG, JobLockedError, NoUsableCheckpointError
from gpufleet.launch import forked, shim
from gpufleet.launch.fatal import read_fatal
from gpufleet.launch.node import _scratch
from gpufleet.launch.worker import local_notes
from gpufleet.procs import pid_alive
from gpufleet.spec import validate_training_job
from tests.support.specs import digits_job

# Everything the shim reads or sets in the environment: absent unless a test sets it.
TOUCHED = ("RANK", "GPUFLEET_FRAMEWORK", "GPUFLEET_RUN_DIR", "GPUFLEET_OUTPUT_HANG_TIMEOUT",
           "GPUFLEET_AGENT_PID", "GPUFLEET_TF_WORKERS", "GPUFLEET_TF_INDEX", "TF_CONFIG",
           "JOB_COMPLETION_INDEX", "OMP_NUM_THREADS", "TF_CPP_MIN_LOG_LEVEL",
           "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")  # fmt: skip
# A user's script: records what it saw next to itself, then raises what RAISE names.
PROBE = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    seen = {"argv": sys.argv, "path0": sys.path[0], "name": __name__,
            "env": {k: os.environ.get(k) for k in %r}}
    Path(__file__).with_suffix(".json").write_text(json.dumps(seen))
    exec(os.environ.get("PROBE_RAISE", ""))
""") % (TOUCHED,)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A worker's environment with none of TOUCHED set; sys.argv and sys.path restored after."""
    for name in (*TOUCHED, "PROBE_RAISE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return monkeypatch


def probe(directory: Path, name: str = "train.py") -> Path:
    script = directory / name
    script.write_text(PROBE)
    return script


def seen(script: Path) -> dict[str, Any]:
    return dict(json.loads(script.with_suffix(".json").read_text()))


def test_a_script_runs_as_main_with_its_arguments_and_its_directory_first(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    script = probe(tmp_path)
    shim._run_user([str(script), "--lr", "0.1"])
    got = seen(script)
    assert (got["argv"], got["path0"], got["name"]) == (
        [str(script), "--lr", "0.1"], str(tmp_path), "__main__")  # fmt: skip


def test_a_module_runs_as_python_m_would(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    module = probe(tmp_path, "gpufleet_shim_probe.py")
    sys.path.insert(0, str(tmp_path))
    shim._run_user(["-m", "gpufleet_shim_probe", "a", "b"])
    got = seen(module)
    assert got["argv"] == [str(module), "a", "b"] and got["name"] == "__main__"


@pytest.mark.parametrize(
    ("raise_", "said"),
    [
        ("raise RuntimeError('[pair.cc:534] Connection closed by peer [127.0.0.1]:41\\nmore')",
         "RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:41"),
        ("from torch.distributed import DistError; raise DistError('')", "DistError: DistError"),
    ],
)  # fmt: skip
def test_a_lost_peer_is_one_line_and_exit_1(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raise_: str,
    said: str,
) -> None:  # fmt: skip
    env.setenv("RANK", "3")
    env.setenv("PROBE_RAISE", raise_)
    with pytest.raises(SystemExit) as exit_:
        shim._run([str(probe(tmp_path))])
    assert exit_.value.code == 1
    assert capsys.readouterr().err == (
        f"gpufleet: rank 3 lost a peer in a collective ({said}); the launcher restarts the "
        "group from the last checkpoint\n"
    )


def test_any_other_runtime_error_keeps_its_traceback(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("PROBE_RAISE", "raise RuntimeError('CUDA out of memory')")
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        shim._run([str(probe(tmp_path))])


def test_without_torch_distributed_a_peer_message_is_the_users_own_error(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setitem(sys.modules, "torch.distributed", None)  # a torch built without distributed
    assert shim._peer_lost(RuntimeError("Connection reset by peer")) is False
    with shim._safe_group_teardown():  # nothing to protect, and nothing patched
        pass


def test_a_fatal_error_is_recorded_once_said_once_and_is_the_exit_code(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = probe(tmp_path)
    env.setenv("GPUFLEET_RUN_DIR", str(tmp_path))
    env.setenv("PROBE_RAISE", "from gpufleet.errors import NoUsableCheckpointError as E; "
                              "raise E('every checkpoint is corrupt')")  # fmt: skip
    env.setenv("RANK", "1")
    with pytest.raises(SystemExit) as first:
        shim._run([str(script)])
    env.delenv("RANK")  # a second rank (no RANK: recorded as None) finds it recorded
    with pytest.raises(SystemExit) as second:
        shim._run([str(script)])
    assert first.value.code == second.value.code == NoUsableCheckpointError.exit_code
    assert read_fatal(tmp_path) == {"exit_code": 4, "message": "every checkpoint is corrupt",
                                    "rank": 1}  # fmt: skip
    assert capsys.readouterr().err == "gpufleet: every checkpoint is corrupt\n"


def test_a_gpufleet_error_that_is_not_fatal_or_has_no_run_dir_propagates(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    script = probe(tmp_path)
    env.setenv("GPUFLEET_RUN_DIR", str(tmp_path))
    env.setenv(
        "PROBE_RAISE", "from gpufleet.errors import JobLockedError; raise JobLockedError('x')"
    )
    with pytest.raises(JobLockedError):
        shim._run([str(script)])
    env.delenv("GPUFLEET_RUN_DIR")
    env.setenv(
        "PROBE_RAISE", "from gpufleet.errors import NonFiniteError; raise NonFiniteError('nan')"
    )
    with pytest.raises(Exception, match="nan"):
        shim._run([str(script)])
    assert read_fatal(tmp_path) is None


def test_without_torchs_private_world_a_destroy_still_reaches_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[object] = []

    def torchs(group: object = None) -> None:
        calls.append(group)

    for module in (dist, c10d):
        monkeypatch.setattr(module, "destroy_process_group", torchs)
    monkeypatch.delattr(c10d, "_world")
    with shim._safe_group_teardown():
        dist.destroy_process_group()
    assert calls == [None]
    assert dist.destroy_process_group is c10d.destroy_process_group is torchs  # put back


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize(("code", "group_closed"), [(0, False), (None, False), (3, True)])
def test_a_failing_exit_closes_the_group_first(group: None, code: int | None,
                                               group_closed: bool) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        shim._failing_last(lambda _argv: sys.exit(code), [])
    assert exit_.value.code == code
    assert dist.is_initialized() is not group_closed


def test_a_pytorch_workers_error_prints_its_traceback_then_closes_and_exits_1(
    tmp_path: Path, env: pytest.MonkeyPatch, group: None, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("PROBE_RAISE", "raise ValueError('bad batch')")
    with pytest.raises(SystemExit) as exit_:
        shim._shim([str(probe(tmp_path))])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.rstrip().endswith("ValueError: bad batch")
    assert not dist.is_initialized()


def test_a_tensorflow_worker_gets_its_tf_config_and_torchs_thread_counts(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    workers = "127.0.0.1:7001,127.0.0.1:7002"
    for name, value in {"GPUFLEET_FRAMEWORK": "tensorflow", "GPUFLEET_TF_INDEX": "1",
                        "GPUFLEET_TF_WORKERS": workers, "OMP_NUM_THREADS": "3",
                        "TF_CONFIG": '{"from": "around us"}'}.items():  # fmt: skip
        env.setenv(name, value)
    script = probe(tmp_path)
    shim._shim([str(script)])
    got = seen(script)["env"]
    assert json.loads(got["TF_CONFIG"]) == {
        "cluster": {"worker": ["127.0.0.1:7001", "127.0.0.1:7002"]},
        "task": {"type": "worker", "index": 1},
    }
    assert [got[k] for k in ("TF_CPP_MIN_LOG_LEVEL", "TF_NUM_INTRAOP_THREADS",
                             "TF_NUM_INTEROP_THREADS")] == ["1", "3", "3"]  # fmt: skip


def test_a_single_tensorflow_worker_keeps_the_users_settings(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("GPUFLEET_FRAMEWORK", "tensorflow")
    env.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    script = probe(tmp_path)
    shim._framework_worker([str(script)])
    got = seen(script)["env"]
    assert got["TF_CONFIG"] is None and got["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert got["TF_NUM_INTRAOP_THREADS"] is None  # no OMP_NUM_THREADS to follow


def test_a_bad_tensorflow_worker_index_is_one_line_and_exit_2(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("GPUFLEET_FRAMEWORK", "tensorflow")
    env.setenv("GPUFLEET_TF_WORKERS", "127.0.0.1:7001,127.0.0.1:7002")
    env.setenv("GPUFLEET_TF_INDEX", "5")
    script = probe(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        shim._framework_worker([str(script)])
    assert exit_.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (
        "gpufleet: worker index '5' (GPUFLEET_TF_INDEX, else JOB_COMPLETION_INDEX, else RANK) is "
        "not one of the 2 workers of GPUFLEET_TF_WORKERS\n"
    )
    assert not script.with_suffix(".json").exists()  # the script never ran


def test_a_ray_driver_runs_as_it_is(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    env.setenv("GPUFLEET_FRAMEWORK", "ray")
    env.setenv("OMP_NUM_THREADS", "2")
    script = probe(tmp_path)
    shim._shim([str(script), "--address", "auto"])
    got = seen(script)
    assert got["argv"] == [str(script), "--address", "auto"]
    assert got["env"]["TF_CPP_MIN_LOG_LEVEL"] is None and got["env"]["TF_CONFIG"] is None


def run_shim(tmp_path: Path, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """``python -m gpufleet.launch.shim ARGS`` as a worker of a Ray job (no torch to import)."""
    base = {k: v for k, v in os.environ.items() if k not in TOUCHED}
    return subprocess.run([sys.executable, "-m", "gpufleet.launch.shim", *args], cwd=tmp_path,
                          env={**base, "GPUFLEET_FRAMEWORK": "ray", **environ},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_shim_without_a_command_prints_its_usage_and_exits_2(tmp_path: Path) -> None:
    done = run_shim(tmp_path)
    assert done.returncode == 2
    assert done.stdout.startswith("usage: python -m gpufleet.launch.shim <script.py | -m module>")


def test_a_worker_whose_agent_died_before_it_started_kills_itself(tmp_path: Path) -> None:
    script = probe(tmp_path)
    done = run_shim(tmp_path, str(script), GPUFLEET_AGENT_PID="1")  # pid 1 is not its parent
    assert done.returncode == -9
    assert not script.with_suffix(".json").exists()


def test_a_ray_drivers_own_connection_error_keeps_its_traceback(tmp_path: Path) -> None:
    (tmp_path / "driver.py").write_text("raise RuntimeError('Connection reset by peer')")
    done = run_shim(tmp_path, "driver.py")  # no torch in it: not a collective's peer
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "lost a peer" not in done.stderr


def test_a_silent_command_job_is_ended_by_its_output_watchdog(tmp_path: Path) -> None:
    (tmp_path / "silent.py").write_text("import time; print('started', flush=True); time.sleep(60)")
    done = run_shim(tmp_path, "silent.py", GPUFLEET_OUTPUT_HANG_TIMEOUT="0.5", RANK="2")
    assert done.returncode == EXIT_HUNG
    assert done.stdout == "started\n"
    assert "gpufleet: rank 2 made no output or heartbeat for " in done.stderr


WORKER = textwrap.dedent("""
    import sys
    from gpufleet.launch.shim import worker
    worker(*sys.argv[1:])
""")
SESSION = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    Path("worker.json").write_text(json.dumps({
        "leader": os.getsid(0) == os.getpid(), "path0": sys.path[0], "argv": sys.argv,
        "comm": Path("/proc/self/comm").read_text().strip(),
        "buffered": [sys.stdout.line_buffering, sys.stderr.line_buffering]}))
""")


def test_a_forked_worker_is_arranged_as_its_command_would_be(tmp_path: Path) -> None:
    (tmp_path / "pkg_worker_probe.py").write_text(SESSION)
    base = {k: v for k, v in os.environ.items() if k not in TOUCHED}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, "-m", "pkg_worker_probe", "x"], cwd=tmp_path,
        env={**base, "GPUFLEET_FRAMEWORK": "ray", "RANK": "7"}, timeout=60, check=True,
    )  # fmt: skip
    assert done.returncode == 0
    got = json.loads((tmp_path / "worker.json").read_text())
    assert got["leader"] is True  # its own session: a terminal's Ctrl-C reaches the agent alone
    assert got["comm"] == "gpufleet-rank7"
    assert got["path0"] == str(tmp_path)  # python -m puts the working directory first
    assert got["argv"] == [str(tmp_path / "pkg_worker_probe.py"), "x"]
    assert got["buffered"] == [True, True]


def test_a_worker_without_fork_is_started_as_its_command() -> None:
    argv = [sys.executable, "-u", "-m", "gpufleet.launch.shim", "train.py"]
    assert forked.entrypoint(argv, fork=False) == (argv[0], argv[1:], None)


def test_stop_ends_only_a_forkserver_that_a_forked_launch_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = forkserver.ForkServer()  # this test's own, with nothing to preload
    server.set_forkserver_preload([])
    monkeypatch.setattr(forkserver, "_forkserver", server)
    server.ensure_running()
    pid = server._forkserver_pid  # type: ignore[attr-defined]
    try:
        forked.stop(None)  # the workers were commands: no forkserver of ours
        assert pid_alive(pid)
        forked.stop(forked.START_METHOD)
        assert server._forkserver_pid is None and not pid_alive(pid)  # type: ignore[attr-defined]
    finally:
        if server._forkserver_pid is not None:  # type: ignore[attr-defined]
            server._stop()  # type: ignore[attr-defined]


def test_a_function_workers_exit_is_logged_without_the_agents_traceback() -> None:
    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord(forked._FAILURE_LOGGER, logging.ERROR, __file__, 1,
                                 "failed (exitcode: 1)", None, (type(exc), exc, None))  # fmt: skip

    exited = record(ProcessExitedException("process 0 exited", 0, 1234, 1))
    assert forked._no_exit_traceback(exited) is True
    assert exited.exc_info is None and exited.getMessage() == "failed (exitcode: 1)"
    other = record(DistError("store down"))
    assert forked._no_exit_traceback(other) is True
    assert other.exc_info is not None  # any other error keeps its traceback


def test_cluster_only_and_gpu_fields_are_noted_when_run_here() -> None:
    notes = local_notes(validate_training_job(digits_job(resources={"cpu": "2", "gpu": 1},
                                                       procsPerNode=1)))  # fmt: skip
    assert notes[0] == "note: cluster-only fields ignored locally: resources.cpu/memory"
    gloo = "note: spec.resources.gpu is set but no CUDA device is here; using gloo on CPU"
    assert (gloo in notes) is not torch.cuda.is_available()
    assert local_notes(validate_training_job(digits_job())) == []


@pytest.mark.parametrize("before", [None, "/var/tmp"])
def test_a_non_pytorch_agent_gives_its_workers_a_scratch_tmpdir_and_takes_it_back(
    monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    monkeypatch.setenv("TMPDIR", before or "")
    if before is None:
        monkeypatch.delenv("TMPDIR")
    with _scratch(False):
        assert os.environ.get("TMPDIR") == before
    with _scratch(True):
        scratch = Path(os.environ["TMPDIR"])
        assert scratch.is_dir() and scratch.name.startswith("gpufleet-workers-")
        (scratch / "autograph_module.py").write_text("x = 1")
    assert os.environ.get("TMPDIR") == before and not scratch.exists()
