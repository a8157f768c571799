#!/usr/bin/env bash
# Build Horovod (spec.framework horovod) for the PyTorch of one Python environment, from its
# source distribution with two upstream fixes applied at build time, as distributions patch a
# package. Horovod 0.28.1 (2023) is its last release; it does not compile against torch >= 2.1.
#   patches/horovod/0001-*: horovod#3998 (commit 3a31d933, merged 2024, not released): the
#     torch module and Gloo are compiled as C++17 for torch >= 2.1. Without it:
#     `#error C++17 or later compatible compiler is required to use PyTorch.`
#   patches/horovod/0002-*: horovod#3957 (commit ff4ca09d): two missing #includes that gcc 13
#     (Ubuntu 24.04, the CUDA image's base) needs.
# Gloo always; MPI too where the environment has Open MPI's compiler wrapper (mpicxx: the
# image's Horovod step installs libopenmpi-dev); CPU operations only (no nvcc is looked for).
#
#   scripts/build-horovod.sh sdist                  print the sdist's path (downloaded once)
#   scripts/build-horovod.sh wheel PYTHON [SDIST]   print the wheel's path (built once per key)
#   scripts/build-horovod.sh install VENV           build for VENV's torch, install it there
#
# Kept outside the clone in $GPUFLEET_HOROVOD_CACHE (default ~/.cache/gpufleet/horovod): the
# sdist, and each wheel under a key of what made it (the sdist, the patches, this script, the
# Python, torch, the compiler, Open MPI's version or none). A wheel takes ~3.5 min of 2 cores
# to build, then this is a no-op. One build at a time per cache ($CACHE/.lock).
set -euo pipefail
shopt -s inherit_errexit  # set -e inside $(...) too: a failed step is never a cached result
SCRIPT=$(realpath "$0")
# The arguments after the first are paths as the caller gave them (or a command on PATH, for
# PYTHON): resolved before the cd to the checkout.
ARGS=("${1:-}")
for arg in "${@:2}"; do
  if [ -e "$arg" ] || [[ $arg == */* ]]; then ARGS+=("$(realpath -m "$arg")"); else ARGS+=("$arg"); fi
done
cd "$(dirname "$SCRIPT")/.."

VERSION=0.28.1
SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
SDIST_URL=https://files.pythonhosted.org/packages/e4/86/da559fcc1620ac7831a16ccb2ad3acb477a8da8a631f75a83b6410507210/horovod-$VERSION.tar.gz
CACHE=${GPUFLEET_HOROVOD_CACHE:-$HOME/.cache/gpufleet/horovod}
PATCHES=(patches/horovod/*.patch)
# The build's tools, beside the Python (on its path for the build only): setuptools and wheel
# for setup.py, and CMake below 4, which refuses Gloo's cmake_minimum_required(VERSION 2.8.12).
# Pinned here, not in constraints.txt: the image's torch layer is keyed by that file.
TOOLS=(setuptools==84.2.1 wheel==0.48.0 cmake==3.31.10)
work=

die() { echo "build-horovod: $*" >&2; exit 1; }

# Move a finished directory into its place in the cache, replacing a stale one whole.
publish() { rm -rf "$2" && mv -T "$1" "$2"; }

# The sdist, fetched once and checked against its pinned hash (a mismatch is fatal, never used).
sdist() {
  local file=$CACHE/horovod-$VERSION.tar.gz
  if [ ! -f "$file" ]; then
    # PIP_CERT: the CA bundle pip trusts in an image build (docker/Dockerfile), curl too.
    curl -fsSL --retry 3 ${PIP_CERT:+--cacert "$PIP_CERT"} -o "$file.part" "$SDIST_URL" ||
      die "cannot download $SDIST_URL"
    mv "$file.part" "$file"
  fi
  echo "$SDIST_SHA256  $file" | sha256sum -c --quiet - >&2 ||
    die "$file is not Horovod $VERSION's sdist (sha256 differs): delete it to download again"
  echo "$file"
}

build_tools() {
  local python=$1 dir
  dir=$CACHE/tools-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-$(
    echo "${TOOLS[*]}" | sha256sum | cut -c1-8)
  if [ ! -x "$dir/bin/cmake" ]; then
    rm -rf "$dir.part"
    "$python" -m pip install -q --no-cache-dir --disable-pip-version-check --target "$dir.part" \
      "${TOOLS[@]}" >&2 || die "cannot install the build's tools (${TOOLS[*]})"
    publish "$dir.part" "$dir"
  fi
  echo "$dir"
}

# What decides the wheel: the sdist, the patches and this script (their contents), Python,
# torch, the C++ compiler, and Open MPI's version where it is built with MPI ("none" else).
wheel_key() {
  local python=$1 torch=$2 mpi=$3
  { echo "$SDIST_SHA256 $torch mpi=$mpi" && "$python" -VV && c++ -dumpfullversion &&
    cat "${PATCHES[@]}" "$SCRIPT"; } | sha256sum | cut -c1-12
}

# The wheel for PYTHON's torch: unpack, patch (a patch that no longer applies is fatal), build.
wheel() {
  local python=$1 file=${2:-} torch mpi=none out tools
  [ -n "$file" ] || file=$(sdist)
  echo "$SDIST_SHA256  $file" | sha256sum -c --quiet - >&2 || die "$file: sha256 differs"
  torch=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
    die "$python has no torch: Horovod's torch module is built against it"
  if command -v mpicxx >/dev/null; then mpi=$(mpicxx --showme:version 2>&1 | head -1); fi
  out=$CACHE/wheel-$(wheel_key "$python" "$torch" "$mpi")
  if ! compgen -G "$out/horovod-$VERSION-*.whl" >/dev/null; then
    work=$(mktemp -d)  # global: the EXIT trap runs after this function has returned
    trap 'rm -rf "$work"' EXIT
    tar -xzf "$file" -C "$work"
    for patch in "${PATCHES[@]}"; do
      patch -d "$work/horovod-$VERSION" -p1 --forward --batch --fuzz=0 --quiet <"$patch" >&2 ||
        die "$patch no longer applies to Horovod $VERSION's sdist"
    done
    tools=$(build_tools "$python")
    echo "build-horovod: building Horovod $VERSION for torch $torch (Gloo; MPI: $mpi)" >&2
    (
      export PYTHONPATH=$tools${PYTHONPATH:+:$PYTHONPATH} PATH=$tools/bin:$PATH
      export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
      export HOROVOD_WITH_GLOO=1
      # CPU operations by default: MPI's where built (Gloo's under horovodrun --gloo or gpufleet
      # run, which ask for them), else Gloo's (upper case: CMake compares it so).
      if [ "$mpi" != none ]; then export HOROVOD_WITH_MPI=1
      else export HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO; fi
      unset CUDA_HOME CUDA_PATH HOROVOD_GPU_OPERATIONS  # CPU only: no CUDA compiler is looked for
      export MAKEFLAGS=-j$(nproc)
      "$python" -m pip wheel -q --no-cache-dir --disable-pip-version-check \
        --no-build-isolation --no-deps -w "$work/wheels" "$work/horovod-$VERSION" >&2
    ) || die "Horovod $VERSION did not build for torch $torch (the compiler's error is above)"
    mkdir "$work/out"
    mv "$work"/wheels/horovod-*.whl "$work/out/"
    publish "$work/out" "$out"
  fi
  compgen -G "$out/horovod-$VERSION-*.whl"
}

# Build for VENV's torch and install the wheel there (its dependencies are gpufleet's horovod
# extra, which VENV has from its install); a no-op when that build is installed there.
install() {
  local venv=$1 whl
  whl=$(wheel "$venv/bin/python")
  if [ "$(cat "$venv/.horovod-wheel" 2>/dev/null)" != "$whl" ] ||
    ! "$venv/bin/python" -c 'import importlib.util as u; assert u.find_spec("horovod")' 2>/dev/null
  then
    "$venv/bin/python" -m pip install -q --no-deps --force-reinstall \
      --disable-pip-version-check "$whl" >&2
    echo "$whl" >"$venv/.horovod-wheel"
  fi
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"  # one build at a time per cache: clones and the image share it
flock 9
set -- "${ARGS[@]}"
case ${1:-} in
  sdist) sdist ;;
  wheel) [ $# -ge 2 ] || die "usage: $0 wheel PYTHON [SDIST]"; wheel "$2" "${3:-}" ;;
  install) [ $# -eq 2 ] || die "usage: $0 install VENV"; install "$2" ;;
  *) die "usage: $0 sdist | wheel PYTHON [SDIST] | install VENV" ;;
esac
