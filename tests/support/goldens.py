"""The golden files: what each one holds is produced here, once, for the tests and the updater.

The tests compare the rendered text with the file, byte for byte, and never write it. After an
intended change to a renderer, rewrite the files in a separate step and review the diff:

    python -m tests.support.goldens          # or: make goldens
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from gpufleet.render import FRAMEWORK_TARGETS, SERVING_TARGETS, render_spec
from gpufleet.spec import validate_spec
from tests.support.paths import REPO

GOLDEN = REPO / "tests" / "golden"
TRAINING_SPEC = GOLDEN / "digits-cluster.spec.yaml"
TF_SPEC = GOLDEN / "tf-digits-cluster.spec.yaml"
RAY_SPEC = GOLDEN / "ray-digits-cluster.spec.yaml"
SERVING_SPEC = REPO / "examples" / "digits-serving.yaml"


def _rendered(spec_file: Path, target: str) -> Callable[[], str]:
    def text() -> str:
        doc = yaml.safe_load(spec_file.read_text())
        if target == "trainjob":  # what a TrainJob cannot carry (render/checks.py): the
            # runtime's 30 s grace period, no metrics port
            doc["spec"]["preemption"]["gracePeriod"] = "30s"
            doc["spec"].pop("metrics")
        if target == "kserve":  # KServe serves from a PVC only (render/serving.py kserve_errors)
            pvc = {"claimName": "models", "subPath": "repository"}
            doc["spec"]["model"] = {"name": doc["spec"]["model"]["name"], "pvc": pvc}
            # and on in-flight requests (KServe's concurrency), not Triton's queue time
            doc["spec"]["autoscaling"] = {"metric": "inflight", "targetInflight": 8}
        spec = validate_spec(doc, str(spec_file))
        return yaml.safe_dump_all(render_spec(spec, target), sort_keys=False)

    return text


# golden file -> how to produce its text
GOLDENS: dict[Path, Callable[[], str]] = {
    **{
        GOLDEN / f"digits-cluster.{t}.yaml": _rendered(TRAINING_SPEC, t)
        for t in FRAMEWORK_TARGETS["pytorch"]
    },
    **{
        GOLDEN / f"tf-digits-cluster.{t}.yaml": _rendered(TF_SPEC, t)
        for t in FRAMEWORK_TARGETS["tensorflow"]
    },
    **{
        GOLDEN / f"ray-digits-cluster.{t}.yaml": _rendered(RAY_SPEC, t)
        for t in FRAMEWORK_TARGETS["ray"]
    },
    **{GOLDEN / f"digits-serving.{t}.yaml": _rendered(SERVING_SPEC, t) for t in SERVING_TARGETS},
}


def golden_text(path: Path) -> str:
    """What the golden file at ``path`` must hold, rendered now."""
    return GOLDENS[path]()


def update() -> list[Path]:
    """Rewrite every golden file whose rendering changed; return those paths."""
    changed = []
    for path, text in GOLDENS.items():
        new = text()
        if not path.is_file() or path.read_text() != new:
            path.write_text(new)
            changed.append(path)
    return changed


if __name__ == "__main__":
    changed = update()
    for path in changed:
        print(f"rewrote {path.relative_to(REPO)}")
    print(f"{len(changed)} of {len(GOLDENS)} golden files changed; review them with git diff")
    sys.exit(0)
