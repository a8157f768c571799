# shellcheck shell=bash disable=SC2034  # sourced: its names are used by the scripts
# Sourced by scripts/make-base-image.sh and scripts/build-image.sh: the one home of the image
# names, the archive cache and the tools they need.
#
# The builder is Debian's buildah (1.28 in bookworm), not BuildKit: a packaged, maintained
# Dockerfile builder that runs RUN steps without a daemon (--isolation chroot), so it works
# on a machine with no systemd, cgroup v1 and no container engine, and it keeps its images in
# containers/storage (overlay; vfs where the kernel has no overlay) for warm rebuilds.

BASE_IMAGE=localhost/gpufleet-base:bookworm # scripts/make-base-image.sh builds it
IMAGE_REPO=localhost/gpufleet               # tagged <flavor>-<key of the build's inputs>
IMAGE_CACHE=${GPUFLEET_IMAGE_CACHE:-$HOME/.cache/gpufleet/images}

# The image name of a flavor and key: localhost/gpufleet:cpu-0123456789ab.
image_name() { echo "$IMAGE_REPO:$1-$2"; }

# The OCI archive of a flavor and key, outside the clone; <flavor>-latest names the newest.
archive_path() { echo "$IMAGE_CACHE/gpufleet-$1-$2.tar"; }

# The image's bills of materials beside its archive (scripts/build-image.sh, sbom): format
# (syft's output name) -> the file's suffix; and the label of the image that holds each one's
# sha256: <SBOM_LABEL>.<suffix>.sha256.
declare -A SBOM_FORMATS=([spdx-json]=spdx.json [cyclonedx-json]=cdx.json)
SBOM_LABEL=dev.gpufleet.sbom
sbom_path() { echo "$IMAGE_CACHE/gpufleet-$1-$2.$3"; }

# Install the Debian packages that are missing (as scripts/get-prometheus.sh does): CI starts
# from a fresh machine.
need_debs() {
  local pkg missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "image: install the Debian packages ${missing[*]} (as root), then run again" >&2
    exit 1
  fi
  echo "image: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# buildah's storage: overlay, unless the kernel lacks it (then vfs, which copies every layer in
# full: several times the disk and minutes more per build).
storage_driver() {
  if grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null; then
    echo overlay
  else
    echo "image: the kernel has no overlay filesystem; buildah falls back to vfs" >&2
    echo vfs
  fi
}
