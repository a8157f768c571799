"""The committed schemas are exactly what the pinned controllers' CRDs give: regenerating them
from the manifests the control-plane build extracted writes the same bytes."""

from __future__ import annotations

from gpufleet.devcluster.build import binaries_dir
from tests.support.k8s_schemas import generate
from tests.support.paths import REPO


def test_committed_schemas_equal_a_regeneration_from_the_pinned_crds() -> None:
    binaries = binaries_dir()
    assert (binaries / "manifests").is_dir() and (binaries / "crds").is_dir(), (
        f"no CRD manifests in {binaries}: run `make controlplane` (make test does)"
    )
    for path, text in generate(binaries).items():
        where = path.relative_to(REPO)
        assert path.is_file(), f"{where} is missing: run `make schemas`"
        assert path.read_text() == text, f"{where} differs from its CRD: run `make schemas`"
