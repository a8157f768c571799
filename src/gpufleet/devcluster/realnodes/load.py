"""``gpufleet cluster load ARCHIVE...``: images into the running cluster's real nodes, as
``kind load image-archive`` does for kind's: a team's own image (docs/images.md), built with
no registry, for its jobs' ``spec.image``. The archives are OCI archives (``buildah push
IMAGE oci-archive:FILE:IMAGE``, ``docker save``). Each node keeps them across clusters;
``cluster up --image`` of another build of the project's image replaces its older builds only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpufleet.devcluster.realnodes import images
from gpufleet.devcluster.realnodes.chaos import real_nodes
from gpufleet.devcluster.realnodes.kind import import_all
from gpufleet.errors import ClusterUpError, FieldError, UserInputError


def load(directory: Path, archives: list[Path], log: Callable[[str], None]) -> list[str]:
    """Import ``archives`` into every real node of the cluster in ``directory``. Returns the
    names of the images they hold."""
    missing = [str(a) for a in archives if not a.is_file()]
    if missing:
        raise UserInputError([FieldError("ARCHIVE", f"no such file: {', '.join(missing)}")])
    try:
        names = [n for a in archives for n in images.names_in(a)]
    except ClusterUpError as exc:
        raise UserInputError([FieldError("ARCHIVE", str(exc))]) from None
    nodes, state = real_nodes(directory)
    if not nodes:
        raise ClusterUpError(f"no cluster with real nodes runs from {directory}")
    import_all(Path(state.binaries), nodes, archives, log)
    return names
