#!/usr/bin/env bash
# `make compat TORCH=<version>`: the core of the suite against another torch than the pinned
# one (constraints.txt), in a venv of its own, .compat/torch-<version> (make's .venv keeps the
# pinned build). Its torch is installed first, at that version; gpufleet and its test
# dependencies then go around it, with every other pin of constraints.txt, so nothing replaces
# it. The core: the spec, the runtime (checkpoints, the Trainer), the launch (torchrun's agents,
# the pod launcher), local runs that resume and the chaos classes (COMPAT_TESTS). The result,
# with the versions and the machine, goes to benchmarks/results/ (benchmarks/compat.py).
# torch's wheels on PyPI are CUDA builds: a version not yet in uv's cache downloads ~2.5 GB.
set -euo pipefail
version=${1:-}
if [[ ! $version =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then
  echo "make compat: TORCH must be a release, e.g. make compat TORCH=2.8.0 (got '$version')" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
venv=.compat/torch-$version
uv=.venv/bin/uv  # make's venv carries uv (constraints.txt)
mkdir -p "$venv"
[ -x "$venv/bin/python" ] || "$uv" venv -q --python .venv/bin/python "$venv"
# constraints.txt without its torch pin, and torch at the version asked.
{ grep -v '^torch==' constraints.txt; echo "torch==$version"; } > "$venv/constraints.txt"
"$uv" pip install -q --python "$venv/bin/python" -c "$venv/constraints.txt" "torch==$version"
"$uv" pip install -q --compile-bytecode --python "$venv/bin/python" -c "$venv/constraints.txt" \
  -e '.[dev]'
# The core of the suite.
COMPAT_TESTS=(
  tests/unit/test_spec.py tests/unit/test_hostile_spec.py tests/unit/test_checkpoint.py
  tests/unit/test_integrity.py tests/unit/test_trainer.py tests/unit/test_runtime_parts.py
  tests/unit/test_runtime_misc.py tests/unit/test_runtime_faults.py
  tests/unit/test_runtime_durable.py tests/unit/test_resume_position.py
  tests/unit/test_global_batch.py tests/unit/test_coordinated.py tests/unit/test_fatal.py
  tests/unit/test_forked.py tests/unit/test_shim.py tests/unit/test_launch_parts.py
  tests/unit/test_launch_shim.py tests/unit/test_launch_summary.py
  tests/unit/test_launch_orphans.py tests/unit/test_torchapi.py tests/unit/test_parallel.py
  tests/integration/test_install.py tests/integration/test_fsdp_gloo.py
  tests/integration/test_local_run.py
  tests/integration/test_pod_launcher.py tests/integration/test_watchdog.py
  tests/integration/test_checkpoint_tiers.py tests/chaos
)
status=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-auto}" \
  --junitxml="$venv/junit.xml" "${COMPAT_TESTS[@]}" || status=$?
"$venv/bin/python" -m benchmarks.compat "$venv/junit.xml" "$status"
exit "$status"
