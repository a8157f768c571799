#!/usr/bin/env bash
# Build localhost/gpufleet-base:bookworm, the base of the image's CPU flavor, from Debian's own
# packages: no registry needed. debootstrap --variant=minbase bookworm, then one layer on
# scratch with buildah. Its apt sources are this machine's, so that the image's builds reach
# the same Debian mirror the host does (where it is the only one reachable).
#   scripts/make-base-image.sh        (re)build it; scripts/build-image.sh calls it when missing
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/image-lib.sh
source "$here/image-lib.sh"
need_debs buildah debootstrap
STORAGE_DRIVER=$(storage_driver)
export STORAGE_DRIVER

# The host's Debian mirror for bookworm (GPUFLEET_DEBIAN_MIRROR overrides it).
# shellcheck disable=SC2016  # $(...) is apt's format, not the shell's
mirror=${GPUFLEET_DEBIAN_MIRROR:-$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' |
  awk '$2 == "bookworm" { print $1; exit }')}
mirror=${mirror:-http://deb.debian.org/debian/}

rootfs=$(mktemp -d /var/tmp/gpufleet-base.XXXXXX)
ctr=
cleanup() {
  rm -rf "$rootfs"
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null
}
trap cleanup EXIT

echo "base: debootstrap --variant=minbase bookworm from $mirror" >&2
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 ||
  { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"

# The host's sources (deb822 and one-line), and the keyrings they name that the rootfs lacks.
rm -f "$rootfs/etc/apt/sources.list"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  if [ -f "$f" ]; then cp "$f" "$rootfs$f"; fi
done
grep -hoiE 'signed-by(:|=) *[^] ]+' "$rootfs"/etc/apt/sources.list* -r 2>/dev/null |
  sed -E 's/^[^:=]*[:=] *//' | sort -u | while read -r key; do
    if [ -f "$key" ] && [ ! -e "$rootfs$key" ]; then install -D -m 0644 "$key" "$rootfs$key"; fi
  done
# Slimmer, as Debian's own container images are: no package cache, no indexes.
rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "${rootfs:?}"/dev/*

# One layer on scratch: buildah add of a tar keeps owners, modes and links as debootstrap made them.
ctr=$(buildah from scratch)
tar --numeric-owner --xattrs -C "$rootfs" -cf "$rootfs.tar" .
buildah add "$ctr" "$rootfs.tar" / >/dev/null
rm -f "$rootfs.tar"
buildah config --os linux --arch amd64 --cmd bash \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --label org.opencontainers.image.title=gpufleet-base \
  --label org.opencontainers.image.description="debootstrap --variant=minbase bookworm ($mirror)" \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
ctr=
echo "base: $BASE_IMAGE ($(buildah images --format '{{.Size}}' "$BASE_IMAGE"))" >&2
