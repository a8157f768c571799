"""The control plane's executables and manifests, built from ``controlplane/`` by
scripts/build-controlplane.sh into the checkout's ``.tools/controlplane`` (or
$GPUFLEET_CONTROLPLANE_BIN), built on first use."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from gpufleet.devcluster import addons
from gpufleet.errors import FieldError, UserInputError

REPO = Path(__file__).resolve().parents[3]  # a checkout: where .tools/ and scripts/ are
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# Every executable the build makes: the control plane, kwok, each controller's manager, and
# kubeseal (what seals a Secret with Sealed Secrets' certificate).
KUBESEAL = "kubeseal"
COMPONENTS = (*CONTROL_PLANE, "kwok", *(a.name for a in addons.ADDONS), KUBESEAL)
# A CRD file of a project not run here (controlplane/crds.txt): present once the build ran.
OTHER_CRDS_MARK = Path("crds") / "keda.sh_scaledobjects.yaml"


def binaries_dir() -> Path:
    """Where the built components are: $GPUFLEET_CONTROLPLANE_BIN, else the checkout's
    .tools/controlplane."""
    return Path(os.environ.get("GPUFLEET_CONTROLPLANE_BIN", REPO / ".tools" / "controlplane"))


def needed_files(where: Path) -> list[Path]:
    """What a complete build leaves in ``where``."""
    needed = [where / n for n in COMPONENTS]
    needed += [addons.manifest_path(where, a) for a in addons.ADDONS]
    needed += [
        where / "manifests" / f"{a.after_ready}.yaml" for a in addons.ADDONS if a.after_ready
    ]
    return [*needed, where / OTHER_CRDS_MARK]


def ensure_built(log: Callable[[str], None]) -> Path:
    """The binaries' directory, building what is missing with scripts/build-controlplane.sh."""
    where = binaries_dir()
    if all(path.is_file() for path in needed_files(where)):
        return where
    script = REPO / "scripts" / "build-controlplane.sh"
    if not script.is_file():
        missing = [n for n in COMPONENTS if not (where / n).is_file()]
        raise UserInputError(
            [
                FieldError(
                    "GPUFLEET_CONTROLPLANE_BIN",
                    f"{where} lacks {', '.join(missing)}; build them with "
                    "scripts/build-controlplane.sh from a gpufleet checkout",
                )
            ]
        )
    log("building the control plane from controlplane/go.mod (a first build takes minutes)")
    subprocess.run(["bash", str(script), *COMPONENTS], check=True)
    return where
