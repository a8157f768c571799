#!/usr/bin/env bash
# The GPU checks, in one command on a lent GPU machine, in the repository's root there: every
# `gpu` test and the GPU benchmarks (collectives over NCCL, digits DDP/FSDP2 and bf16 throughput,
# Triton serving on CUDA through LoadGen, the NVML exporter), on the device's own Python and
# torch as they are. What it needs from here, scripts/gpu-prep.sh makes (.gpu-carry/) and tells
# how to carry: a first call stashes a part of PyTriton's wheel (`gpu-check.sh stash`), the
# second runs this. Nothing is patched: gpufleet takes the device's torch (its range, 2.8 on).
#   scripts/gpu-check.sh [stash | join DIR]     (join: the joined wheel into DIR, its path printed)
# Results: benchmarks/results/ (gpu-check_<gpu>_<date>.md and .json, with the machine's facts,
# and each benchmark's own), copied to $OUT when the device tool sets it. Exit 0 when every step
# passed, 1 when one failed, 2 on a machine without a GPU (nothing is run).
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${GPU_CARRY:-.gpu-carry}
stash=${GPU_STASH:-.gpu-stash}  # ignored and never carried: a warm device keeps it between calls
python=${GPU_CHECK_PYTHON:-python3}
budget=${GPU_CHECK_SECONDS:-540}  # the device tool's 10 minutes a command, less the set-up

# PyTriton's wheel from its two parts, into $1, checked against its SHA-256; its path printed.
join() {
  local sum name
  if [ ! -f "$stash/part-1" ] || [ ! -f "$carry/part-2" ]; then
    echo "gpu-check: PyTriton's wheel is not all here (stash its part first): Triton is skipped" >&2
    return 1
  fi
  read -r sum name < "$carry/manifest.txt"
  cat "$stash/part-1" "$carry/part-2" > "$1/$name"
  if [ "$(sha256sum < "$1/$name" | cut -d' ' -f1)" != "$sum" ]; then
    echo "gpu-check: $name joined from its parts does not match its SHA-256: left out" >&2
    rm -f "$1/$name" && return 1
  fi
  echo "$1/$name"
}

case ${1:-} in
  stash) mkdir -p "$stash" && cp "$carry/part-1" "$stash/" && echo "gpu-check: stashed $stash/part-1"
    exit ;;
  join) join "$2"; exit ;;
esac
if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
  >/dev/null 2>&1; then
  echo "gpu-check: no CUDA device here ($("$python" -c 'import torch; print("torch", torch.__version__, "sees none")' 2>&1 | tail -1)):" \
    "run it on a lent GPU machine (docs/development.md); nothing was run" >&2
  exit 2
fi

# The wheels go into a folder of their own on PYTHONPATH, beside the device's packages (its
# python3 is a venv's: a venv made from it would not see them); `python` is that python3.
work=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$work/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$python")" > "$work/bin/python"
chmod +x "$work/bin/python"
wheels=("$carry"/wheels/*.whl)
if pytriton=$(join "$work"); then wheels+=("$pytriton"); fi
"$python" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" \
  "${wheels[@]}" || exit 1
export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH} PATH=$work/bin:$work/site/bin:$PATH
export PYTHONUNBUFFERED=1
steps=$work/steps.jsonl
: > "$steps"

# One step: its name, a share of the time budget (percent), the command. Its record is a line
# of $steps (name, command, exit code, seconds, the output's last 40 lines).
step() {
  local name=$1 share=$2 started rc
  shift 2
  echo "gpu-check: $name: $*" >&2
  started=$(date +%s)
  timeout --kill-after=10 "$((budget * share / 100))" "$@" > "$work/$name.log" 2>&1
  rc=$?
  python - "$name" "$*" "$rc" "$(($(date +%s) - started))" "$work/$name.log" >> "$steps" <<'PY'
import json, sys
name, command, rc, seconds, log = sys.argv[1:]
tail = "\n".join(open(log, errors="replace").read().splitlines()[-40:])
print(json.dumps({"name": name, "command": command, "exit": int(rc), "seconds": float(seconds),
                  "tail": tail}))
PY
}

step tests 35 python -m pytest -q -p no:cacheprovider -m gpu --timeout=240 \
  --junitxml=benchmarks/results/gpu-check-tests.xml tests/integration/test_gpu.py \
  tests/unit/test_runtime_misc.py tests/unit/test_runtime_faults.py
step collectives 10 python benchmarks/collectives.py --rounds 1 --pairs 3 --procs 1 \
  --max-bytes $((64 << 20))
step parallelism 15 python benchmarks/parallelism.py --rounds 1
step inference 20 python benchmarks/inference.py --offline-seconds 3 --server-seconds 2 \
  --bisect-steps 3 --single-queries 100 --rounds 1 --hostile-loops 5
step exporter 7 python benchmarks/exporter_scrape.py --scrapes 50
python -m benchmarks.gpu_check "$steps"
rc=$?
if [ -n "${OUT:-}" ]; then  # at most 8 files come back
  ls -t benchmarks/results/*"$(date +%F)"*.md benchmarks/results/gpu-check_*.json \
    benchmarks/results/gpu-check-tests.xml 2>/dev/null | head -8 | xargs -r cp -t "$OUT"
fi
exit $rc
