"""The image's bills of materials (`make image`, scripts/build-image.sh's sbom): SPDX and
CycloneDX files beside the archive, the archive's labels naming each file's sha256, and the
SBOMs listing every package of docker/image.lock at its locked version (what pip installed by
hash is what the image holds) with the Debian packages beside them."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.imagelock import locked, normalized
from tests.support.paths import REPO
from tests.support.realnodes import project_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="make image builds as root only"),
]
IMAGE_LIB = (REPO / "scripts" / "image-lib.sh").read_text()
# The suffixes of the SBOM files and the labels' prefix, from their one home.
SUFFIXES = dict(re.findall(r"\[([a-z-]+)\]=([a-z.]+)", IMAGE_LIB.split("SBOM_FORMATS=", 1)[1]
                           .split("\n", 1)[0]))  # fmt: skip
LABEL = re.search(r"^SBOM_LABEL=(\S+)", IMAGE_LIB, re.M).group(1)  # type: ignore[union-attr]


def config_of(archive: Path) -> dict[str, Any]:
    """The image configuration of a one-image OCI archive (index, manifest, config blob)."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> Any:
            member = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert member is not None
            return json.load(member)

        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        (manifest,) = index["manifests"]
        config: dict[str, Any] = blob(blob(manifest["digest"])["config"]["digest"])
        return config


def pypi(purls: list[str]) -> dict[str, set[str]]:
    """PyPI packages among package URLs: normalized name -> its versions (a package may be
    vendored inside another at another version: setuptools' copy of platformdirs)."""
    versions: dict[str, set[str]] = {}
    for m in (re.match(r"pkg:pypi/([^@]+)@([^?#]+)", p) for p in purls):
        if m:
            versions.setdefault(normalized(m.group(1)), set()).add(m.group(2))
    return versions


@pytest.fixture(scope="module")
def built() -> tuple[Path, dict[str, Path]]:
    """The CPU image's archive (built by `make test` before the suite) and its SBOMs."""
    _, archive = project_image()
    stem = archive.name.removesuffix(".tar")
    return archive, {fmt: archive.with_name(f"{stem}.{sfx}") for fmt, sfx in SUFFIXES.items()}


def test_the_archives_labels_name_each_sboms_sha256(built: tuple[Path, dict[str, Path]]) -> None:
    archive, sboms = built
    labels = config_of(archive)["config"]["Labels"]
    assert set(SUFFIXES) == {"spdx-json", "cyclonedx-json"}
    for fmt, path in sboms.items():
        label = f"{LABEL}.{SUFFIXES[fmt].removesuffix('.json')}.sha256"
        assert labels[label] == hashlib.sha256(path.read_bytes()).hexdigest(), (label, path)


def test_the_sboms_list_every_locked_package_at_its_version(
    built: tuple[Path, dict[str, Path]],
) -> None:
    _, sboms = built
    spdx = json.loads(sboms["spdx-json"].read_text())
    cdx = json.loads(sboms["cyclonedx-json"].read_text())
    assert spdx["spdxVersion"] == "SPDX-2.3" and cdx["bomFormat"] == "CycloneDX"
    spdx_purls = [r["referenceLocator"] for p in spdx["packages"]
                  for r in p.get("externalRefs", []) if r["referenceType"] == "purl"]  # fmt: skip
    cdx_purls = [c["purl"] for c in cdx["components"] if "purl" in c]
    lock = locked()
    for purls in (spdx_purls, cdx_purls):
        listed = pypi(purls)
        missing = {n: v for n, v in lock.items() if v not in listed.get(n, set())}
        assert len(lock) > 100 and not missing, missing
        assert listed["gpufleet"] and listed["horovod"]  # its own wheel, and Horovod's build
        debs = {re.match(r"pkg:deb/debian/([^@]+)@", p).group(1)  # type: ignore[union-attr]
                for p in purls if p.startswith("pkg:deb/debian/")}  # fmt: skip
        assert {"python3.11", "openssh-server", "openmpi-bin", "libssl3"} <= debs
