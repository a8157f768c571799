#!/usr/bin/env bash
# `make scan`: the image's SBOM (`make image` writes it beside the archive) scanned for known
# vulnerabilities by grype, built from controlplane/sbom (pinned by go.sum's hashes, never a
# downloaded release: a trivy release was malicious in 2026, CVE-2026-33634). Not part of `make
# test`: grype needs its vulnerability database, which this machine cannot fetch; on one that
# can, `grype db update` fetches it (or `grype db import <archive>` takes one made elsewhere),
# and docs/security.md says how. Exit 2 without an SBOM or a database, 1 on a finding at or
# above FAIL_ON.
#   scripts/scan-image.sh [SBOM]       default: the CPU image's SPDX SBOM
#   GRYPE_DB_CACHE_DIR   where the database is (grype's default: ~/.cache/grype/db)
#   FAIL_ON              the severity that fails the scan (default: high)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/image-lib.sh
source scripts/image-lib.sh
sbom=${1:-$IMAGE_CACHE/gpufleet-cpu.${SBOM_FORMATS[spdx-json]}}
if [ ! -f "$sbom" ]; then
  echo "scan: no SBOM at $sbom (make image writes it)" >&2
  exit 2
fi
BINARIES_ONLY=1 bash scripts/build-controlplane.sh grype >&2
grype=.tools/controlplane/grype
# Never fetch anything: the database at hand, or none.
export GRYPE_DB_AUTO_UPDATE=false GRYPE_CHECK_FOR_APP_UPDATE=false
if ! status=$("$grype" db status 2>&1); then
  echo "scan: no usable vulnerability database${GRYPE_DB_CACHE_DIR:+ in $GRYPE_DB_CACHE_DIR}:" >&2
  echo "$status" | sed 's/\x1b\[[0-9;]*m//g; s/^/  /' >&2
  echo "  on a machine that reaches grype.anchore.io: $grype db update, then copy its" \
    "cache directory here (GRYPE_DB_CACHE_DIR), or $grype db import <archive>" >&2
  exit 2
fi
# grype exits 2 on a finding at or above --fail-on: 1 here, 2 stays "nothing to scan with"
status=0
"$grype" "sbom:$sbom" --fail-on "${FAIL_ON:-high}" || status=$?
if [ "$status" = 2 ]; then exit 1; fi
exit "$status"
