#!/usr/bin/env bash
# The image's Python dependencies, locked with their hashes (issue 55): docker/image.lock, every
# package the image installs at its exact version with the sha256 of each of its files on PyPI
# (uv pip compile --generate-hashes, every file of the version: the CPU image's Python 3.11 and
# the CUDA base's 3.12 find theirs), and docker/torch.lock, torch's own part of it, which the
# image installs as a layer of its own first. docker/Dockerfile installs both with pip's
# --require-hashes: a file whose hash is not in the lock is refused, and so is a package that
# is not in it. Run after a change to constraints.txt or to the extras below; commit the locks.
#   scripts/lock-image.sh
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
# The image's Python, as uv names its platform: Debian bookworm's 3.11 and glibc 2.36.
TARGET=(--python-version 3.11 --python-platform x86_64-manylinux_2_36)
# What the image holds: torch, gpufleet's dependencies and those of the extras its jobs and
# servers use (cli, digits, exporter, s3, cluster, encryption, serve, tensorflow, ray, horovod's
# own, dashboard), read from pyproject.toml.
EXTRAS="cli digits exporter s3 cluster encryption serve tensorflow ray horovod dashboard"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$EXTRAS" >"$work/image.in" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
print("\n".join(["torch", *project["dependencies"],
                 *(r for name in sys.argv[1].split() for r in extras[name])]))
EOF
compile() {
  "$UV" pip compile -q --generate-hashes --no-header --no-annotate "${TARGET[@]}" "$@"
}
compile -c constraints.txt "$work/image.in" -o docker/image.lock
# torch's part at the very versions of the whole lock
sed -n 's/^\([A-Za-z0-9_.-]*\(\[[^]]*\]\)\?==[^ ;]*\).*/\1/p' docker/image.lock >"$work/pins.txt"
echo torch | compile -c "$work/pins.txt" - -o docker/torch.lock
echo "docker/image.lock: $(grep -c '==' docker/image.lock) packages;" \
  "docker/torch.lock: $(grep -c '==' docker/torch.lock)"
