#!/usr/bin/env bash
# Build the gpufleet image here, with no registry, and write it as an OCI archive that
# containerd imports (`ctr -n k8s.io images import <archive>`):
#   scripts/build-image.sh [cpu|cuda|own]      (make image: cpu)
# cpu: docker/Dockerfile on localhost/gpufleet-base:bookworm (scripts/make-base-image.sh, built
# when missing); cuda: on its default CUDA base, which needs that base's registry; own: a team's
# own PyTorch image with gpufleet added as docs/images.md says (build_own).
# The image is localhost/gpufleet:<flavor>-<key>, <key> a hash of the build's inputs; its archive
# is $GPUFLEET_IMAGE_CACHE/gpufleet-<flavor>-<key>.tar (default ~/.cache/gpufleet/images), and
# gpufleet-<flavor>.tar links to the newest. With that archive there already, nothing is done.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/image-lib.sh
source scripts/image-lib.sh

# What the image is made of: a change to any of these is a new key.
INPUTS=(docker/Dockerfile docker/sshd_config docker/torch.lock docker/image.lock .dockerignore
  pyproject.toml src
  scripts/build-horovod.sh patches/horovod examples/horovod_digits.py)

# What the own flavor adds: the stand-in for a team's image, and the lines the team adds.
OWN_INPUTS=(docker/own-base.Dockerfile examples/own-image/Dockerfile)

# Files of $@ as the working tree has them (tracked or not, but not ignored), NUL-separated.
input_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard -- "$@" | sort -zu |
      while IFS= read -r -d '' f; do if [ -f "$f" ]; then printf '%s\0' "$f"; fi; done
  else
    find "$@" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 |
      sort -z
  fi
}

# 12 hex digits of sha256 over the flavor, its base and the inputs' paths and contents.
input_key() {
  local flavor=$1
  {
    echo "$flavor"
    if [ "$flavor" != cuda ]; then echo "$BASE_IMAGE" && sha256sum scripts/make-base-image.sh; fi
    if [ "$flavor" = own ]; then torch_floor && input_files "${OWN_INPUTS[@]}" | xargs -0 sha256sum --; fi
    input_files "${INPUTS[@]}" | xargs -0 sha256sum --
  } | sha256sum | cut -c1-12
}

# The lowest torch gpufleet takes, as a release: pyproject.toml's "torch>=2.8.0a0" is 2.8.0.
torch_floor() {
  python3 -c 'import re, tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print(next(re.fullmatch(r"torch>=([0-9.]+?)(a0)?", d)[1] for d in deps if d.startswith("torch>=")))'
}

# Build the image, and tag its build stage too, so that a prune keeps that stage's cache. pip
# in the RUN steps trusts what this host trusts (a TLS-inspecting proxy's CA included): the
# host's CA bundle is bind-mounted at /mnt, which every base has, empty.
build() {
  local flavor=$1 key=$2 bundle common options
  bundle=$(realpath /etc/ssl/certs/ca-certificates.crt)
  common=(--layers --isolation=chroot --force-rm
    "--volume=$(dirname "$bundle"):/mnt:ro" "--build-arg=PIP_CERT=/mnt/$(basename "$bundle")")
  if [ "$flavor" != cuda ]; then
    common+=("--build-arg=BASE=$BASE_IMAGE")
    buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1 || scripts/make-base-image.sh
  fi
  options=(-f docker/Dockerfile "${common[@]}")
  buildah bud "${options[@]}" --target build -t "$(image_name "$flavor" "$key")-build" .
  if [ "$flavor" = own ]; then
    build_own "$key" "${common[@]}"
  else
    buildah bud "${options[@]}" -t "$(image_name "$flavor" "$key")" .
  fi
}

# A team's own PyTorch image, as docs/images.md "Your own PyTorch image" makes it: the
# team's two lines (examples/own-image/Dockerfile) on a stand-in for its image (own_base: torch
# at gpufleet's floor, not the pinned build of gpufleet's image), gpufleet from this checkout's
# wheel (the build stage's) with the extras cli and digits. pip trusts this host's CA bundle
# through /etc/pip.conf, mounted for the build alone: the team's file names neither. The wheel's
# folder is named by the key, so that a new wheel misses the layer cache.
build_own() {
  local key=$1 work ctr mnt wheel
  shift
  if ! buildah inspect --type image "$(own_base)" >/dev/null 2>&1; then
    buildah bud "$@" -f docker/own-base.Dockerfile --build-arg "TORCH=$(torch_floor)" \
      -t "$(own_base)" .
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"; trap - RETURN' RETURN
  mkdir "$work/$key"
  ctr=$(buildah from --quiet "$(image_name own "$key")-build")
  mnt=$(buildah mount "$ctr")
  cp "$mnt"/wheels/gpufleet-*.whl "$work/$key/"
  buildah umount "$ctr" >/dev/null
  buildah rm "$ctr" >/dev/null
  wheel=$(basename "$work/$key"/gpufleet-*.whl)
  cp "$(realpath /etc/ssl/certs/ca-certificates.crt)" "$work/ca.crt"
  printf '[global]\ncert = /mnt/ca.crt\n' > "$work/pip.conf"
  buildah bud --layers --isolation=chroot --force-rm -f examples/own-image/Dockerfile \
    "--volume=$work:/mnt:ro" "--volume=$work/pip.conf:/etc/pip.conf:ro" \
    "--build-arg=BASE=$(own_base)" "--build-arg=GPUFLEET=/mnt/$key/$wheel[cli,digits]" \
    -t "$(image_name own "$key")" .
}

# The stand-in for a team's image, named as a flavor (ownbase) by what it is made of (its torch
# too), so that a node keeps one build of it; its archive: the image without gpufleet that the
# tests run too.
own_base() {
  image_name ownbase "$({ echo "$BASE_IMAGE" && torch_floor
    sha256sum docker/own-base.Dockerfile; } | sha256sum | cut -c1-12)"
}
own_base_archive() { archive_path ownbase "$(own_base | cut -d- -f2)"; }

# The SPDX and CycloneDX SBOMs of the image just built (syft, built from controlplane/sbom by
# scripts/build-controlplane.sh, which `make test` runs beside this: its module's go.sum pins it
# by hash; syft is not in that script's default list, so the two never build the same thing), written beside where its
# archive goes, from the image's root file system (Debian's packages, every Python package with
# its version and licence, Java archives); then the image is labelled with each file's sha256
# (a configuration change: no layer is added, and the packages the SBOMs list are unchanged).
# gpufleet's own images only: a team's own image (own) is the team's to describe.
sbom() {
  local flavor=$1 key=$2 image ctr mnt syft outputs=() labels=() format file
  BINARIES_ONLY=1 bash scripts/build-controlplane.sh syft >&2
  syft=.tools/controlplane/syft
  image=$(image_name "$flavor" "$key")
  for format in "${!SBOM_FORMATS[@]}"; do
    outputs+=(-o "$format=$(sbom_path "$flavor" "$key" "${SBOM_FORMATS[$format]}").tmp")
  done
  ctr=$(buildah from --quiet "$image")
  mnt=$(buildah mount "$ctr")
  "$syft" scan "dir:$mnt" --source-name "$IMAGE_REPO" --source-version "$flavor-$key" -q \
    "${outputs[@]}"
  buildah umount "$ctr" >/dev/null
  buildah rm "$ctr" >/dev/null
  for format in "${!SBOM_FORMATS[@]}"; do
    file=$(sbom_path "$flavor" "$key" "${SBOM_FORMATS[$format]}")
    mv "$file.tmp" "$file"
    ln -sfn "$(basename "$file")" "$IMAGE_CACHE/gpufleet-$flavor.${SBOM_FORMATS[$format]}"
    labels+=("--label=$SBOM_LABEL.${SBOM_FORMATS[$format]%.json}.sha256=$(
      sha256sum "$file" | cut -c1-64)")
  done
  # The unlabelled image keeps a tag of its own (-content): the build steps' images, the layer
  # cache of the next build, are its ancestors, which prune keeps (the labelled image adds no
  # layer, so they are not the labelled one's).
  buildah tag "$image" "$image-content"
  mkdir -p "$IMAGE_CACHE/.label-context"
  printf 'FROM %s\n' "$image" | buildah bud --quiet --isolation=chroot "${labels[@]}" \
    -t "$image" -f - "$IMAGE_CACHE/.label-context" >/dev/null
}

# Write the archive next to its final name, then move it there and point the link at it. Layers
# are zstd-compressed (containerd >= 1.5 reads them): as fast to write as gzip here and ~10%
# smaller; uncompressed ones were slower to write and to import (benchmarks/results/image-build_*).
# buildah pushes into a layout seeded with the layers that the flavor's last archive (and the
# own flavor's base) holds, so it compresses and writes only the new ones, and
# scripts/oci_archive.py packs the archive, taking the held ones from there: after a change in
# src/, the few small layers above torch's, not all 3.4 GB again.
export_archive() {
  local flavor=$1 key=$2 held=("$IMAGE_CACHE/gpufleet-$1.tar")
  if [ "$flavor" = own ]; then  # the base's archive, written once, holds its layers too
    if [ ! -f "$(own_base_archive)" ]; then
      pack_archive "$(own_base)" "$(own_base_archive)" "${held[@]}"
    fi
    held+=("$(own_base_archive)")
  fi
  pack_archive "$(image_name "$flavor" "$key")" "$(archive_path "$flavor" "$key")" "${held[@]}"
  link_archive "$flavor" "$key"
}

# gpufleet-<flavor>.tar: the link to the flavor's newest archive.
link_archive() {
  ln -sfn "$(basename "$(archive_path "$1" "$2")")" "$IMAGE_CACHE/gpufleet-$1.tar"
}

# pack_archive IMAGE OUT [ARCHIVE...]: IMAGE's archive at OUT, reusing the ARCHIVEs' layers.
pack_archive() {
  local image=$1 out=$2 layout
  shift 2
  layout="$out.layout.tmp"
  rm -rf "$layout" "$out.tmp"
  python3 scripts/oci_archive.py seed "$layout" "$@"
  buildah push --quiet --compression-format zstd "$image" "oci:$layout:$image"
  python3 scripts/oci_archive.py pack "$layout" "$image" "$out.tmp" "$@"
  rm -rf "$layout"
  mv "$out.tmp" "$out"
}

# Keep one archive and one image (with its build stage) per flavor; drop what a build that
# was stopped left behind (untagged images with the Dockerfile's vendor label). Layers that the
# current image shares stay: they are the cache of the next build.
prune() {
  local flavor=$1 key=$2 ref id
  prune_archives "$flavor" "$key" "$(readlink "$IMAGE_CACHE/gpufleet-$flavor.tar" || true)"
  for f in "$IMAGE_CACHE/gpufleet-$flavor"-*.json "$IMAGE_CACHE/gpufleet-$flavor"-*.json.tmp; do
    if [ -f "$f" ] && [[ "$(basename "$f")" != "gpufleet-$flavor-$key".* ]]; then rm -f "$f"; fi
  done
  buildah images --noheading --format '{{.Name}}:{{.Tag}}' --filter "reference=$IMAGE_REPO" |
    while read -r ref; do
      case $ref in
        "$IMAGE_REPO:$flavor-$key" | "$IMAGE_REPO:$flavor-$key-build" | \
          "$IMAGE_REPO:$flavor-$key-content") ;;
        "$IMAGE_REPO:$flavor-"*) buildah rmi "$ref" >/dev/null || echo "prune: kept $ref (in use)" ;;
      esac
    done
  if [ "$flavor" = own ]; then  # and older stand-ins
    for f in "$IMAGE_CACHE"/gpufleet-ownbase-*.tar{,.tmp}; do
      if [ -f "$f" ] && [ "$f" != "$(own_base_archive)" ]; then rm -f "$f"; fi
    done
    buildah images --noheading --format '{{.Name}}:{{.Tag}}' --filter "reference=$IMAGE_REPO" |
      while read -r ref; do
        case $ref in
          "$(own_base)") ;;
          "$IMAGE_REPO:ownbase-"*) buildah rmi "$ref" >/dev/null || echo "prune: kept $ref" ;;
        esac
      done
  fi
  for _ in 1 2 3 4 5 6 7 8; do  # a pass removes the leaves; their parents are next
    id=$(buildah images --quiet --filter dangling=true \
      --filter label=org.opencontainers.image.vendor=gpufleet)
    [ -n "$id" ] || break
    # shellcheck disable=SC2086  # one ID a word
    buildah rmi $id >/dev/null 2>&1 || break
  done
}

# The flavor's archives but this build's and LAST (the link's target until this build's archive
# is written: its layers are reused); and what a stopped export left.
prune_archives() {
  local flavor=$1 keep last=${3:-} f
  keep=$(basename "$(archive_path "$flavor" "$2")")
  for f in "$IMAGE_CACHE/gpufleet-$flavor"-*.tar "$IMAGE_CACHE/gpufleet-$flavor"-*.tar.tmp; do
    if [ -f "$f" ] && [ "$(basename "$f")" != "$keep" ] && [ "$(basename "$f")" != "$last" ]; then
      rm -f "$f"
    fi
  done
  rm -rf "$IMAGE_CACHE"/*.layout.tmp
}

report() {
  local flavor=$1 key=$2 image
  image=$(image_name "$flavor" "$key")
  echo "image: $image ($(buildah images --noheading --format '{{.Size}}' "$image"))"
  echo "archive: $(archive_path "$flavor" "$key") ($(du -h "$(archive_path "$flavor" "$key")" | cut -f1))"
  if [ "$flavor" != own ]; then echo "sboms: $(sbom_path "$flavor" "$key" '{spdx,cdx}.json')"; fi
  echo "buildah storage: $(du -sh "$(buildah info --format '{{.store.GraphRoot}}')" | cut -f1)"
}

up_to_date() {
  local flavor=$1 key=$2 suffix
  [ -f "$(archive_path "$flavor" "$key")" ] || return 1
  if [ "$flavor" != own ]; then
    for suffix in "${SBOM_FORMATS[@]}"; do [ -f "$(sbom_path "$flavor" "$key" "$suffix")" ] || return 1; done
  fi
  # The link names it, even where a build stopped between writing the archive and linking it.
  link_archive "$flavor" "$key"
  echo "up to date: $(archive_path "$flavor" "$key") ($(image_name "$flavor" "$key"))"
}

main() {
  local flavor=${1:-cpu} key
  case $flavor in cpu | cuda | own) ;; *) echo "usage: $0 [cpu|cuda|own]" >&2 && exit 2 ;; esac
  key=$(input_key "$flavor")
  up_to_date "$flavor" "$key" && return 0
  # One build at a time on this machine (a build prunes the other images of its flavor); a
  # build that waited may find its archive made meanwhile.
  mkdir -p "$IMAGE_CACHE"
  exec 9>"$IMAGE_CACHE/.build.lock"
  flock -n 9 || { echo "waiting for another image build ($IMAGE_CACHE/.build.lock)" && flock 9; }
  up_to_date "$flavor" "$key" && return 0
  need_debs buildah
  STORAGE_DRIVER=$(storage_driver)
  export STORAGE_DRIVER
  SECONDS=0
  build "$flavor" "$key"
  echo "build: ${SECONDS} s" && SECONDS=0
  # The other builds go before this one's archive is written, but the last archive, whose
  # layers it takes (scripts/oci_archive.py): that and the new one are what a tight disk holds.
  prune "$flavor" "$key"
  echo "prune: ${SECONDS} s" && SECONDS=0
  if [ "$flavor" != own ]; then
    sbom "$flavor" "$key"
    echo "sbom: ${SECONDS} s" && SECONDS=0
  fi
  export_archive "$flavor" "$key"
  prune_archives "$flavor" "$key"
  echo "export: ${SECONDS} s"
  report "$flavor" "$key"
}

main "$@"
