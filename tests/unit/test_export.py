"""gpufleet export: checkpoints and TorchScript files into Triton repositories; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.errors import EXIT_BAD_INPUT
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.serve.repository import read_repository
from gpufleet.serve.torchscript import TorchScriptModel
from gpufleet.workloads.digits import DigitsCNN
from tests.support.paths import REPO

pytest.importorskip("tritonclient.grpc")


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["export", *args])
    return result.exit_code, result.output


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, DigitsCNN]:
    torch.manual_seed(1)
    model = DigitsCNN().eval()
    root = tmp_path / "run" / "checkpoints"
    ck = Checkpointer(str(root), log=lambda _: None)
    ck.save(10, {"job": {"model": DigitsCNN().state_dict()}})  # an older one
    ck.save(20, {"job": {"model": model.state_dict()}})
    return tmp_path / "run", model


def test_newest_checkpoint_of_a_run_becomes_a_repository(
    checkpoint: tuple[Path, DigitsCNN], tmp_path: Path
) -> None:
    run_dir, model = checkpoint
    code, out = run(str(run_dir), "--repository", str(tmp_path / "repo"))
    assert code == 0, out
    assert "(step 20)" in out
    (entry,) = read_repository(tmp_path / "repo")
    x = torch.rand(5, 1, 8, 8)
    got = TorchScriptModel(entry)({"INPUT__0": x.numpy()})["OUTPUT__0"]
    torch.testing.assert_close(torch.from_numpy(got), model(x).detach())
    assert entry.batching.max_batch_size == 64 and entry.gpu is False


def test_service_spec_sets_name_batching_and_gpu(
    checkpoint: tuple[Path, DigitsCNN], tmp_path: Path
) -> None:
    run_dir, _ = checkpoint
    code, out = run(
        str(run_dir),
        "--repository",
        str(tmp_path / "repo"),
        "--service",
        str(REPO / "examples" / "digits-serving.yaml"),
    )
    assert code == 0, out
    (entry,) = read_repository(tmp_path / "repo")
    assert entry.name == "digits" and entry.gpu is True
    assert entry.batching.preferred_batch_sizes == (16, 32, 64)
    assert entry.batching.max_queue_delay_us == 500


def test_torchscript_file_with_input_shape(tmp_path: Path) -> None:
    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(-1)))
    torch.jit.save(module, str(tmp_path / "m.pt"))
    code, out = run(
        str(tmp_path / "m.pt"),
        "--repository",
        str(tmp_path / "repo"),
        "--input-shape",
        "4",
        "--name",
        "tiny",
        "--max-batch-size",
        "8",
        "--preferred-batch-sizes",
        "4,8",
        "--no-dynamic-batching",
    )
    assert code == 0, out
    (entry,) = read_repository(tmp_path / "repo")
    assert (entry.name, entry.inputs[0].dims, entry.outputs[0].dims) == ("tiny", (4,), (3,))
    assert entry.batching.dynamic is False
    assert "dynamic_batching" not in (tmp_path / "repo" / "tiny" / "config.pbtxt").read_text()


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["nowhere"], "CHECKPOINT"),
        (["{run}", "--model", "nope"], "--model"),
        (["{run}", "--model", "torch.nn:Linear"], "--input-shape"),
        (["{run}", "--model", "torch.nn:Linear", "--input-shape", "4"], "--model"),
        (["{run}", "--preferred-batch-sizes", "a,b"], "--preferred-batch-sizes"),
        (["{run}", "--max-batch-size", "8"], "preferred_batch_size"),
        (["{pt}"], "--input-shape"),
        (["{empty}"], "no complete checkpoint"),
    ],
)
def test_bad_input_exits_2_with_the_field(
    checkpoint: tuple[Path, DigitsCNN], tmp_path: Path, args: list[str], field: str
) -> None:
    run_dir, _ = checkpoint
    (tmp_path / "empty").mkdir()
    (tmp_path / "m.pt").write_bytes(b"not torchscript")
    paths = {"run": str(run_dir), "pt": str(tmp_path / "m.pt"), "empty": str(tmp_path / "empty")}
    code, out = run(*[a.format(**paths) for a in args], "--repository", str(tmp_path / "repo"))
    assert code == EXIT_BAD_INPUT, out
    assert field in out
    assert "Traceback" not in out


def test_read_repository_reports_bad_files(tmp_path: Path) -> None:
    from gpufleet.errors import UserInputError

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.pbtxt").write_text("name: 'a'\nmax_batch_size: 'x'\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.pbtxt").write_text('name: "other"\nbackend: "onnxruntime"\n')
    (tmp_path / "c").mkdir()
    with pytest.raises(UserInputError) as err:
        read_repository(tmp_path)
    text = str(err.value)
    assert "a/config.pbtxt" in text and "b/config.pbtxt: backend" in text
    assert "c/config.pbtxt" in text and "missing" in text


def test_a_repository_the_server_may_not_read_exits_2_naming_it(tmp_path: Path) -> None:
    """A read-only volume the pod's UID may not enter (the kubelet hands a volume to the pod's
    fsGroup only when it mounts it writable): one line naming --repository and the UID, exit
    2, where it was an "internal error". As root, without the capabilities that let root
    read what its mode denies (setpriv, util-linux)."""
    import os
    import subprocess
    import sys

    closed = tmp_path / "closed"
    (closed / "repo").mkdir(parents=True)
    closed.chmod(0o000)
    caps = "-dac_override,-dac_read_search"
    limit = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"] if os.geteuid() == 0 else []
    try:
        proc = subprocess.run(
            [*limit, sys.executable, "-m", "gpufleet.cli.main", "serve", "--repository",
             str(closed / "repo")], capture_output=True, text=True, cwd="/", timeout=120,
        )  # fmt: skip
    finally:
        closed.chmod(0o700)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert "--repository" in proc.stderr and "not readable by UID" in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
