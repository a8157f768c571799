"""The Horovod job's parts that need no running job: the spec's rules for spec.framework horovod,
its targets and MPIJob, Horovod's slot variables from torchrun's, and the rendezvous address an
attempt reads from the agents' store (a real TCPStore, and Horovod's own rendezvous server
where Horovod is built here)."""

from __future__ import annotations

import http.server
import importlib.util
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import UserInputError
from gpufleet.frameworks import horovod
from gpufleet.frameworks.horovod import SlotError, run_env, slot_env
from gpufleet.launch import local
from gpufleet.launch.worker import worker_env, worker_module_args
from gpufleet.render import FRAMEWORK_TARGETS, check_restricted, pod_specs_in, render
from gpufleet.spec import validate_training_job
from tests.support.specs import cluster_job, digits_job
from tests.unit.test_launch_shim import run_shim
from tests.unit.test_spec import errors_of

HAS_HOROVOD = importlib.util.find_spec("horovod") is not None
SCRIPT = ["train.py", "--epochs", "3"]


def horovod_job(**spec: Any) -> dict[str, Any]:
    doc = digits_job("hvd", framework="horovod", command=SCRIPT, **spec)
    del doc["spec"]["workload"]
    return doc


@pytest.mark.parametrize(
    ("spec", "path", "text"),
    [
        ({"workload": {"name": "digits"}}, "spec.workload", "no built-in workload: set spec.comm"),
        ({"metrics": {"port": 9400}}, "spec.metrics.port", "a Horovod script writes none"),
        ({"parallelism": {"strategy": "fsdp"}}, "spec.parallelism", "hvd.DistributedOptimizer"),
        ({"nodes": 2, "minNodes": 1}, "spec.minNodes", "fixed number of workers"),
        ({"onNonFinite": "rollback"}, "spec.onNonFinite", "rollback is the PyTorch"),
        ({"checkpoint": {"dir": "s3://b/c"}}, "spec.checkpoint.dir", "not an object store"),
        ({"checkpoint": {"durable": {"dir": "s3://b/c"}}}, "spec.checkpoint.durable", "uploader"),
    ],
)
def test_what_a_horovod_job_cannot_have_is_refused_with_its_path(
    spec: dict[str, Any], path: str, text: str
) -> None:
    doc = horovod_job()
    doc["spec"].update(spec)
    if "workload" in spec:
        del doc["spec"]["command"]
    errs = errors_of(doc)
    assert text in errs.get(path, ""), errs


def test_a_horovod_job_runs_its_script_under_the_worker_shim() -> None:
    job = validate_training_job(horovod_job(nodes=2, procsPerNode=2))
    assert job.spec.framework == "horovod"
    assert worker_module_args(job) == ["-m", "gpufleet.launch.shim", *SCRIPT]
    assert worker_env(job, Path("/run"))["GPUFLEET_FRAMEWORK"] == "horovod"


@pytest.mark.parametrize("target", sorted(set().union(*FRAMEWORK_TARGETS.values()) - {"mpijob"}))
def test_a_horovod_job_is_refused_by_every_target_but_mpijob(target: str) -> None:
    job = validate_training_job(cluster_job(target="mpijob", framework="horovod", nodes=2))
    with pytest.raises(UserInputError) as info:
        render(job, target)
    (error,) = info.value.errors
    assert error.path == "spec.framework"
    assert "a horovod job renders to mpijob" in error.message


def test_an_mpijob_runs_each_horovod_rank_under_mpirun() -> None:
    """mpirun starts the ranks themselves (no torchrun): spec.procsPerNode slots a pod."""
    doc = cluster_job(target="mpijob", framework="horovod", nodes=2, procsPerNode=2)
    objects = render(validate_training_job(doc), "mpijob")
    assert all(check_restricted(pod) == [] for obj in objects for _, pod in pod_specs_in(obj))
    (mpijob,) = objects
    assert mpijob["spec"]["slotsPerWorker"] == 2
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    assert replicas["Worker"]["replicas"] == 2
    command = replicas["Launcher"]["template"]["spec"]["containers"][0]["command"]
    mpirun = command[command.index("mpirun") :]
    assert mpirun[1:5] == ["-np", "4", "--map-by", "ppr:2:node"]
    tail = mpirun[mpirun.index("python") :]
    assert tail[:4] == ["python", "-u", "-m", "gpufleet.launch.shim"], tail
    assert "gpufleet.launch.pod" not in command
    assert mpirun[mpirun.index("GPUFLEET_FRAMEWORK") - 1] == "-x"


def torchrun_env(rank: int, nodes: int = 2, procs: int = 2) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(nodes * procs), "LOCAL_RANK": str(rank % procs),
            "LOCAL_WORLD_SIZE": str(procs), "GROUP_RANK": str(rank // procs),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}  # fmt: skip


def test_horovods_slot_variables_come_from_torchruns() -> None:
    slots = slot_env(torchrun_env(3))
    assert slots == {"HOROVOD_HOSTNAME": "node1", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4",
                     "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                     "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2"}  # fmt: skip
    with pytest.raises(SlotError, match="GROUP_RANK"):
        slot_env({k: v for k, v in torchrun_env(0).items() if k != "GROUP_RANK"})
    # its address is in the agents' shared store, which torch can be told not to share
    with pytest.raises(SlotError, match="unset TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        slot_env({**torchrun_env(0), "TORCHELASTIC_USE_AGENT_STORE": "False"})


def test_gloo_uses_loopback_on_one_machine_and_the_pods_address_elsewhere() -> None:
    here = run_env(torchrun_env(0), "127.0.0.1", 5000)
    assert here["HOROVOD_GLOO_IFACE"] == "lo" and here["HOROVOD_CONTROLLER"] == "gloo"
    assert here["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "5000"
    pods = run_env({**torchrun_env(0), "MASTER_ADDR": "train-worker-0.train"}, "10.0.0.2", 1)
    assert "HOROVOD_GLOO_IFACE" not in pods


class NonceServer(http.server.ThreadingHTTPServer):
    """A server on 127.0.0.1 that answers every GET with ``nonce``: rank 0's of an attempt, or
    another server that took an earlier attempt's port since."""

    def __init__(self, nonce: str) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(nonce.encode())

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def entry(self, nonce: str) -> str:
        return f"127.0.0.1 {self.server_address[1]} {nonce}"


def test_a_rank_waits_past_an_earlier_attempts_address_for_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agents' store keeps the last attempt's address: its server is gone, or its port is
    another server's now. A rank of the next attempt reads again until its rank 0 has written
    an address whose server gives back the nonce published with it."""
    from torch._C._distributed_c10d import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1 {gone.getsockname()[1]} aaaa"
    other, live = NonceServer("another"), NonceServer("bbbb")
    try:
        for stale in (dead, other.entry("aaaa")):
            store.set(horovod.STORE_KEY, stale)
            started = time.monotonic()
            threading.Timer(0.6, store.set, (horovod.STORE_KEY, live.entry("bbbb"))).start()
            assert horovod.current_rendezvous(store) == ("127.0.0.1", live.server_address[1])
            assert time.monotonic() - started >= 0.6  # it waited for the live one
        monkeypatch.setattr(horovod, "STORE_TIMEOUT", timedelta(seconds=0))
        store.set(horovod.STORE_KEY, dead)
        with pytest.raises(TimeoutError, match="no rendezvous answered"):
            horovod.current_rendezvous(store)
    finally:
        for server in (other, live):
            server.shutdown()
            server.server_close()


@pytest.mark.skipif(not HAS_HOROVOD, reason="needs Horovod: scripts/build-horovod.sh install")
def test_rank_0_serves_horovods_rendezvous_sized_by_the_plan() -> None:
    """Horovod's own server: its scopes sized by every rank's slot (a scope is cleared once all
    of its ranks are connected), the nonce in a scope of gpufleet's, Gloo's keys put and read."""
    import urllib.request

    server = horovod.serve_rendezvous("127.0.0.1", slot_env(torchrun_env(0)), "cccc")
    try:
        assert server.scope_size == {"global": 4, "local_node0": 2, "local_node1": 2,
                                     "cross_0": 2, "cross_1": 2}  # fmt: skip
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert urllib.request.urlopen(f"{base}/gpufleet/nonce", timeout=5).read() == b"cccc"
        put = urllib.request.Request(f"{base}/global/0", data=b"addr", method="PUT")
        assert urllib.request.urlopen(put, timeout=5).status == 200
        assert urllib.request.urlopen(f"{base}/global/0", timeout=5).read() == b"addr"
    finally:
        server.shutdown()
        server.server_close()


def test_a_missing_horovod_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "horovod" else real(name, *a))  # fmt: skip
    with pytest.raises(UserInputError) as info:
        local.check_framework(validate_training_job(horovod_job()))
    (error,) = info.value.errors
    assert error.path == "spec.framework"
    assert "scripts/build-horovod.sh install" in error.message


def test_a_horovod_rank_outside_torchrun_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("open('ran', 'w').close()\n")
    done = run_shim(tmp_path, "train.py", GPUFLEET_FRAMEWORK="horovod",
                    TORCHELASTIC_USE_AGENT_STORE="True")  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == ("gpufleet: spec.framework horovod: not started by torchrun's agent: "
                           "'RANK' is missing or not a number\n")  # fmt: skip
    assert not (tmp_path / "ran").exists()


def test_under_mpirun_a_rank_runs_its_script_as_it_is(tmp_path: Path) -> None:
    """Horovod's MPI controller reads MPI's own ranks: nothing is added."""
    (tmp_path / "train.py").write_text(
        "import os; open('seen', 'w').write(os.environ.get('HOROVOD_CONTROLLER', '-'))\n"
    )
    done = run_shim(tmp_path, "train.py", GPUFLEET_FRAMEWORK="horovod", OMPI_COMM_WORLD_RANK="0")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "seen").read_text() == "-"
