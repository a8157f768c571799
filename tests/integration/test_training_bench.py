"""The time-to-target benchmark's scoring and its MLLOG logs under mlperf-logging's compliance
checker: a real run's log passes gpufleet's ruleset, and each way of breaking it fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.bench.mlperf import check, run_minutes, write_ruleset
from gpufleet.bench.training import olympic_minutes


@pytest.mark.parametrize(
    ("minutes", "runs", "want"),
    [
        ([5.0, 1.0, 3.0, 4.0, 2.0], 5, 3.0),  # 1 and 5 dropped
        ([5.0, 1.0, 3.0, 4.0], 5, 4.0),  # one failed: it is the dropped slowest; 1 dropped
        ([5.0, 1.0, 3.0], 5, None),  # two failed: no score
        ([2.0, 4.0], 2, 3.0),  # below three runs: all count
        ([2.0], 2, None),  # ... and all must pass
        ([], 0, None),
    ],
)
def test_olympic_score_is_mlperfs(minutes: list[float], runs: int, want: float | None) -> None:
    assert olympic_minutes(minutes, runs) == want


@pytest.fixture(scope="module")
def real_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run of the benchmark worker (one process, digits to 97 %)."""
    root = tmp_path_factory.mktemp("training")
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.bench.training", "--runs", "1", "--results",
         str(root / "res")],
        cwd=root, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "res" / "result_0.txt"


def _records(log: Path) -> list[dict[str, object]]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()
            if line.startswith(":::MLLOG ")]  # fmt: skip


def test_a_real_run_passes_and_its_time_is_run_start_to_run_stop(
    real_log: Path, tmp_path: Path
) -> None:
    verdict = check(real_log, tmp_path)
    assert verdict.valid, verdict.problems
    records = {r["key"]: r for r in _records(real_log)}
    stop, start = records["run_stop"]["time_ms"], records["run_start"]["time_ms"]
    assert run_minutes(real_log) == pytest.approx((stop - start) / 60_000)  # type: ignore[operator]
    assert records["submission_benchmark"]["value"] == "gpufleet_digits"
    assert records["run_stop"]["metadata"] == pytest.approx(  # type: ignore[arg-type]
        {**records["run_stop"]["metadata"], "status": "success"}  # type: ignore[dict-item]
    )


def _edit_status(r: dict) -> dict | None:  # type: ignore[type-arg]
    if r["key"] == "run_stop":
        r["metadata"]["status"] = "aborted"
    return r


def _drop_target(r: dict) -> dict | None:  # type: ignore[type-arg]
    return None if r["key"] == "eval_accuracy" and r["value"] >= 0.97 else r


def _rename(r: dict) -> dict | None:  # type: ignore[type-arg]
    if r["key"] == "submission_benchmark":
        r["value"] = "resnet"
    return r


def _drop_run_start(r: dict) -> dict | None:  # type: ignore[type-arg]
    return None if r["key"] == "run_start" else r


def _fewer_samples(r: dict) -> dict | None:  # type: ignore[type-arg]
    if r["key"] == "train_samples":
        r["value"] = 1000
    return r


def _no_precision(r: dict) -> dict | None:  # type: ignore[type-arg]
    return None if r["key"] == "lowest_numerical_precision_in_linear" else r


@pytest.mark.parametrize(
    ("edit", "want"),
    [
        (_edit_status, "status"),  # gpufleet's rule: the run must end in success
        (_drop_target, "v['value'] >= 0.97"),  # gpufleet's rule: the target is reached
        (_rename, "submission_benchmark"),  # gpufleet's rule: its own benchmarks only
        (_drop_run_start, "run_start"),  # the package's common rules
        (_fewer_samples, "1438"),  # gpufleet's rule: the whole training split
        (_no_precision, "lowest_numerical_precision_in_linear"),  # the package's 6.1 rule
    ],
    ids=["aborted", "below-target", "other-benchmark", "no-run-start", "samples", "precision"],
)
def test_each_broken_log_fails_for_its_reason(
    real_log: Path, tmp_path: Path, edit: object, want: str
) -> None:
    lines = []
    for record in _records(real_log):
        changed = edit(record)  # type: ignore[operator]
        if changed is not None:
            lines.append(":::MLLOG " + json.dumps(changed))
    broken = tmp_path / "result_0.txt"
    broken.write_text("\n".join(lines) + "\n")
    verdict = check(broken, tmp_path / "check")
    assert not verdict.valid
    assert any(want in p for p in verdict.problems), verdict.problems


def test_the_ruleset_is_the_packages_common_rules_with_the_division_redirected(
    tmp_path: Path,
) -> None:
    import mlperf_logging.compliance_checker as cc

    config = write_ruleset(tmp_path)
    package = (Path(cc.__file__).parent / "training_6.1.0" / "common.yaml").read_text()
    ours = config.read_text()
    assert "closed_common" not in ours and str(tmp_path / "gpufleet_common.yaml") in ours
    assert len(ours.splitlines()) == len(package.splitlines())  # one hook changed, no rule
    changed = [a for a, b in zip(ours.splitlines(), package.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and "submission_division" not in changed[0]
