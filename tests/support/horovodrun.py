"""The Horovod example script (examples/horovod_digits.py) and its reference: rank 0's result
of a whole run by Horovod's own launcher (horovodrun --gloo, 2 processes here), which the
Horovod jobs under gpufleet, here and on real nodes, must end with, bit for bit."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import refcache
from tests.support.paths import REPO

SCRIPT = REPO / "examples" / "horovod_digits.py"
IMAGE_SCRIPT = "/opt/gpufleet/examples/horovod_digits.py"  # where docker/Dockerfile puts it
EPOCHS = 12
WORKERS = 2


def script_args(checkpoints: str, out: str) -> list[str]:
    return ["--epochs", str(EPOCHS), "--checkpoint-dir", checkpoints, "--out", out]


def horovodrun_reference(workdir: Path) -> dict[str, Any]:
    """The uninterrupted run's result (digest, loss, size): once per machine, script and
    packages (tests/support/refcache.py)."""
    script = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()
    key = {"spec": {"horovodrun": ["-np", WORKERS, "--gloo"], "epochs": EPOCHS, "script": script}}

    def whole() -> dict[str, Any]:
        out = workdir / "result.json"
        run = [sys.executable, "-m", "horovod.runner.launch", "-np", str(WORKERS), "-H",
               f"localhost:{WORKERS}", "--gloo", sys.executable, str(SCRIPT),
               *script_args(str(workdir / "ckpt"), str(out))]  # fmt: skip
        done = subprocess.run(run, cwd=workdir, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return dict(json.loads(out.read_text()))

    return refcache.reference(key, whole)
