"""The CLI in process: exit codes and messages for good and bad input, fuzzed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.errors import EXIT_BAD_INPUT
from tests.support.paths import REPO
from tests.support.specs import digits_job, write_spec

runner = CliRunner()


def test_validate_ok() -> None:
    result = runner.invoke(app, ["validate", str(REPO / "examples" / "digits.yaml")])
    assert result.exit_code == 0, result.output
    assert "valid TrainingJob 'digits'" in result.output


def test_validate_json_shows_defaults(tmp_path: Path) -> None:
    path = write_spec(tmp_path, digits_job())
    result = runner.invoke(app, ["validate", str(path), "-o", "json", "--set", "spec.nodes=3"])
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)["job"]
    assert job["spec"]["nodes"] == 3
    assert job["spec"]["checkpoint"]["async"] is False


def test_validate_reports_every_error(tmp_path: Path) -> None:
    path = write_spec(tmp_path, digits_job(nodes=0, maxRestarts=-1, bogus=1))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == EXIT_BAD_INPUT
    for fragment in ("3 errors", "spec.nodes (line", "spec.maxRestarts", "spec.bogus"):
        assert fragment in result.output
    assert "Traceback" not in result.output


def test_cluster_only_fields_noted(tmp_path: Path) -> None:
    path = write_spec(tmp_path, digits_job(image="registry.example/train:1", queue="team-a"))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0
    assert "cluster-only fields ignored locally: image, queue" in result.output


def test_unknown_option_is_usage_error() -> None:
    result = runner.invoke(app, ["run", "x.yaml", "--nodes", "2"])
    assert result.exit_code == EXIT_BAD_INPUT


FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE_OK)
@given(content=st.binary(max_size=300), sets=st.lists(st.text(max_size=20), max_size=3))
def test_fuzz_validate_never_tracebacks(tmp_path: Path, content: bytes, sets: list[str]) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(content)
    args = ["validate", str(path)]
    for s in sets:
        args += ["--set", s]
    result = runner.invoke(app, args)
    assert result.exit_code in (0, EXIT_BAD_INPUT), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


def test_bench_training_without_mlperf_logging_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "mlperf_logging", None)  # as if not installed
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["bench", "training", "--quick"])
    # Exit 2 like every missing extra (issue 27: it was its own message and exit 1).
    assert result.exit_code == EXIT_BAD_INPUT
    assert "mlperf-logging" in result.output
    assert "pip install 'gpufleet[bench]'" in result.output
    assert not (tmp_path / ".gpufleet").exists()  # nothing started


def test_every_command_resolves_a_relative_checkpoint_dir_from_the_spec_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spec.checkpoint.dir "ckpt" means <the spec file's directory>/ckpt to validate and
    render (hence submit) as it does to run, wherever the command starts."""
    specs, elsewhere = tmp_path / "specs", tmp_path / "elsewhere"
    specs.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    wanted = str((specs / "ckpt").resolve())
    local = write_spec(specs, digits_job(checkpoint={"dir": "ckpt"}), "local.yaml")
    result = runner.invoke(app, ["validate", str(local), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["job"]["spec"]["checkpoint"]["dir"] == wanted
    assert f"checkpoints: {wanted} (spec.checkpoint.dir 'ckpt'" in result.output
    volume = {"name": "ckpt", "mountPath": str(specs.resolve()), "claimName": "team-ckpt"}
    doc = digits_job(image="ghcr.io/example/gpufleet:0.1.0", checkpoint={"dir": "ckpt"},
                     volumes=[volume])  # fmt: skip
    rendered = runner.invoke(app, ["render", str(write_spec(specs, doc, "cluster.yaml"))])
    assert rendered.exit_code == 0, rendered.output
    assert f"value: {wanted}\n" in rendered.stdout  # GPUFLEET_CHECKPOINT_DIR
