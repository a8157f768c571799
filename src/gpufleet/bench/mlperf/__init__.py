"""gpufleet's MLPerf Training ruleset, and the compliance check of one result log with
mlperf-logging's own checker.

The checker starts from ``training_<RULESET>/common.yaml``, the rules every MLPerf Training log
obeys: init/run/epoch/eval ordering, the submission fields, the precision and parallelism
disclosures. Its ``submission_division`` rule then enqueues ``{closed,open}_common.yaml``, which
accept only MLPerf's own benchmark names. gpufleet's ruleset is the installed package's
common.yaml with that one hook pointed at ``gpufleet_common.yaml`` here (and from it the
benchmark's own file, ``gpufleet_digits.yaml``); nothing else of the package's rules is copied
or changed.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["RULESET", "Compliance", "check", "run_minutes", "write_ruleset"]

RULESET = "6.1.0"
_HOOK = "'training_{ruleset}/{{}}_common.yaml'.format(v['value'])"


def write_ruleset(into: Path) -> Path:
    """Write gpufleet's ruleset into ``into``; returns the file to pass as ``--config``."""
    import mlperf_logging.compliance_checker as cc

    into.mkdir(parents=True, exist_ok=True)
    here = resources.files(__name__)
    for name in ("gpufleet_common.yaml", "gpufleet_digits.yaml"):
        text = here.joinpath(name).read_text().replace("@DIR@", str(into.resolve()))
        (into / name).write_text(text)
    common = Path(cc.__file__).parent / f"training_{RULESET}" / "common.yaml"
    text = common.read_text()
    hook = _HOOK.format(ruleset=RULESET)
    if hook not in text:  # the package changed how divisions are chained: say so, do not guess
        raise RuntimeError(f"{common} no longer enqueues {hook}; gpufleet's ruleset needs updating")
    target = f"'{(into / 'gpufleet_common.yaml').resolve()}'"
    (into / "common.yaml").write_text(text.replace(hook, target))
    return (into / "common.yaml").resolve()


@dataclass(frozen=True)
class Compliance:
    """The checker's verdict on one log; ``problems`` are its messages, one per line."""

    valid: bool
    problems: list[str]


def check(log: Path, workdir: Path) -> Compliance:
    """Run ``python -m mlperf_logging.compliance_checker`` on ``log`` with gpufleet's ruleset.
    A subprocess: the checker keeps module-level state between files and configures logging."""
    config = write_ruleset(workdir / "ruleset")
    out = (workdir / f"compliance_{log.stem}.log").resolve()
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
         "--ruleset", RULESET, "--config", str(config), "--log_output", str(out), str(log)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    text = out.read_text() if out.is_file() else proc.stderr
    problems = []
    for raw in text.splitlines():  # "WARNING -  Required ..." and multi-line messages
        line = raw.split(" - ", 1)[1].strip() if raw.startswith(("WARNING - ", "ERROR - ")) else raw
        line = line.strip()
        if line.startswith(("CHECK for", "Required", "failed test", "Failed", "Could not find")) \
                or "parsing errors" in line:  # fmt: skip
            problems.append(line)
    valid = proc.returncode == 0
    if not valid and not problems:
        problems = [(proc.stderr.strip().splitlines() or ["the compliance checker failed"])[-1]]
    return Compliance(valid=valid, problems=problems)


def run_minutes(log: Path) -> float | None:
    """MLPerf's time to train: minutes from run_start to run_stop (None if either is missing),
    read with the package's own log parser."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    lines, _errors = parse_file(str(log), ruleset=RULESET)
    stamps = {ll.key: float(ll.timestamp) for ll in lines if ll.key in ("run_start", "run_stop")}
    if "run_start" not in stamps or "run_stop" not in stamps:
        return None
    return (stamps["run_stop"] - stamps["run_start"]) / 60_000.0
