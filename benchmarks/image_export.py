"""What writing the image's archive costs after a change in src/ (scripts/build-image.sh,
export_archive), in one run: the archive as it is written now (a layout seeded from the last
archive, pushed, packed by scripts/oci_archive.py: only the new layers compressed) against
buildah's own push to an OCI archive (every layer compressed again: the baseline), for the
same image.

A clone of this checkout in a temporary directory with one comment line added to
src/gpufleet/__init__.py: a new image key, so `scripts/build-image.sh FLAVOR` builds it as
after any change in src/ (its own lines give the build, SBOM and export seconds); then the
baseline's push of that image, timed; then this checkout's image is built again, so that the
cache holds it as before. Needs root and the flavor's image built once (make image).
Writes benchmarks/results/image-export-<flavor>_<hardware>_<date>.{md,json}.

    python benchmarks/image_export.py [--flavor cpu] [--runs 1]
"""

from __future__ import annotations

import argparse
import re
import secrets
import subprocess
import tempfile
import time
from pathlib import Path

from common import environment, machine_busy, write_results

from gpufleet.devcluster.realnodes.images import image_cache, names_in

REPO = Path(__file__).resolve().parents[1]
PHASES = ("build", "prune", "sbom", "export")


def build(checkout: Path, flavor: str) -> dict[str, float]:
    """`scripts/build-image.sh FLAVOR` in ``checkout``: its phases' seconds (its own lines),
    the wall and the machine's busy CPU-seconds, and the image and archive it names."""
    busy, started = machine_busy(), time.monotonic()
    done = subprocess.run(["bash", "scripts/build-image.sh", flavor], cwd=checkout,
                          capture_output=True, text=True, check=True)  # fmt: skip
    out: dict[str, float] = {"wall": time.monotonic() - started, "cpu": machine_busy() - busy}
    for phase in PHASES:
        found = re.search(rf"^{phase}: (\d+) s$", done.stdout, re.M)
        if found:
            out[phase] = float(found.group(1))
    return out


def image_of(flavor: str) -> str:
    """The image of the flavor's newest archive (its link), as its index names it."""
    (name,) = names_in(image_cache() / f"gpufleet-{flavor}.tar")
    return name


def baseline(image: str, where: Path) -> dict[str, float]:
    """The export before: buildah's push to an OCI archive, every layer compressed (zstd)."""
    busy, started = machine_busy(), time.monotonic()
    archive = where / "baseline.tar"
    subprocess.run(["buildah", "push", "--quiet", "--compression-format", "zstd", image,
                    f"oci-archive:{archive}:{image}"], check=True)  # fmt: skip
    out = {"wall": time.monotonic() - started, "cpu": machine_busy() - busy,
           "bytes": float(archive.stat().st_size)}  # fmt: skip
    archive.unlink()
    return out


def one_run(flavor: str) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="gpufleet-image-export-") as tmp:
        clone = Path(tmp) / "gpufleet"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        init = clone / "src" / "gpufleet" / "__init__.py"
        init.write_text(init.read_text() + f"# {secrets.token_hex(4)}\n")
        changed = build(clone, flavor)
        measured = {"changed": changed, "baseline": baseline(image_of(flavor), Path(tmp))}
    measured["restored"] = build(REPO, flavor)  # this checkout's image in the cache again
    return measured


def report(flavor: str, runs: list[dict[str, dict[str, float]]]) -> list[str]:
    lines = [
        f"# The image's archive after a change in src/ ({flavor})",
        "",
        "`benchmarks/image_export.py`: one comment line added to src/gpufleet/__init__.py in a "
        "clone (a new image key), `scripts/build-image.sh` run there; then buildah's own push "
        "of the same image to an OCI archive, every layer compressed again (the export before "
        "scripts/oci_archive.py), timed in the same run.",
        "",
        "| run | build (s) | SBOM (s) | export now (s) | export before (s) | before / now | "
        "script in all (s) | its CPU (s) | before: CPU (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, run in enumerate(runs, 1):
        ch, base = run["changed"], run["baseline"]
        ratio = base["wall"] / max(ch.get("export", 0.0), 1.0)
        lines.append(f"| {i} | {ch.get('build', 0):.0f} | {ch.get('sbom', 0):.0f} | "
                     f"{ch.get('export', 0):.0f} | {base['wall']:.0f} | {ratio:.1f}x | "
                     f"{ch['wall']:.0f} | {ch['cpu']:.0f} | {base['cpu']:.0f} |")  # fmt: skip
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flavor", default="cpu", choices=("cpu", "own"))
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    runs = [one_run(args.flavor) for _ in range(args.runs)]
    version = subprocess.run(["buildah", "--version"], capture_output=True, text=True)
    env = {**environment(), "buildah": version.stdout.strip()}
    write_results(f"image-export-{args.flavor}", report(args.flavor, runs), env, runs)


if __name__ == "__main__":
    main()
