#!/usr/bin/env bash
# What scripts/gpu-check.sh needs on a lent GPU machine, which reaches no package index, made
# here: .gpu-carry/ (ignored by git), for the device tool's `carry`, within its 64 MiB a call
# (/work/.library/device/README.md: the working tree travels too, and counts).
#   scripts/gpu-prep.sh [DEST]        (make gpu-prep; DEST default .gpu-carry)
# DEST/wheels: gpufleet's wheel, and the packages that the GPU checks need and the device's image
# lacks (NEEDS), for its Python (GPU_PYTHON, 3.12), at the versions make's venv has tested. The
# device's own torch, numpy, scikit-learn... are used as they are: nothing is patched.
# PyTriton's wheel (55 MB: Triton's server and its libraries) does not fit in one call beside
# the working tree, so it goes as two parts: DEST/part-1, stashed on the device by a first call
# (`scripts/gpu-check.sh stash`), and DEST/part-2, carried with the wheels by the second, which
# joins them and checks the joined wheel's SHA-256 (DEST/manifest.txt). It prints both calls.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.gpu-carry}
python=${GPU_PYTHON:-3.12}
limit=$((64 << 20))
# The device image's packages: /work/.library/device/KINDS.md, "Python packages already there".
NEEDS=(pydantic pydantic-core annotated-types typing-inspection tritonclient python-rapidjson
  mlcommons-loadgen mlperf-logging pyzmq sh)
SPLIT=nvidia-pytriton
venv=${VENV:-.venv}

version() { "$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))"; }

download() {  # $1: name==version; one binary wheel for the device's Python and platform
  local platforms=() n
  for n in 17 24 26 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version "$python" \
    --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 -d "$2" "$1"
}

# What travels with every call: the files git would copy (tracked, and untracked not ignored).
tree_bytes() {
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [ -f "$f" ]; then printf '%s\0' "$f"; fi; done |
    du -cb --files0-from=- | tail -1 | cut -f1
}

rm -rf "$dest" && mkdir -p "$dest/wheels" "$dest/split"
"$venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$dest/wheels" .
for name in "${NEEDS[@]}"; do download "$name==$(version "$name")" "$dest/wheels"; done
download "$SPLIT==$(version "$SPLIT")" "$dest/split"
wheel=$(ls "$dest/split")
tree=$(tree_bytes)
wheels=$(du -cb "$dest"/wheels/* | tail -1 | cut -f1)
room=$((limit - tree - wheels - (1 << 20)))  # a MiB for what changes before the call
size=$(stat -c %s "$dest/split/$wheel")
if [ "$room" -le $((size / 2)) ]; then
  echo "gpu-prep: the working tree ($tree bytes) and the wheels ($wheels) leave $room bytes a call:" \
    "too little for $wheel in two parts" >&2
  exit 1
fi
first=$((size - room))
first=$((first > 0 ? first : 0))
head -c "$first" "$dest/split/$wheel" > "$dest/part-1"
tail -c +"$((first + 1))" "$dest/split/$wheel" > "$dest/part-2"
printf '%s  %s\n' "$(sha256sum < "$dest/split/$wheel" | cut -d' ' -f1)" "$wheel" > "$dest/manifest.txt"
rm -rf "$dest/split"
echo "gpu-prep: $dest: $(ls "$dest/wheels" | wc -l) wheels ($wheels bytes), $wheel in two parts;" \
  "working tree $tree bytes; each call under $limit"
echo "gpu-prep: call 1: carry [\"$dest/part-1\"], command: bash scripts/gpu-check.sh stash"
echo "gpu-prep: call 2 (at once, while warm): carry [\"$dest/wheels\", \"$dest/part-2\"," \
  "\"$dest/manifest.txt\"], command: bash scripts/gpu-check.sh"
