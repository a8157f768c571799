# The two set-up commands of the README: `make demo` and `make test`.
# Both create (or reuse) .venv and install the project from its own files.
PYTHON ?= python3
# Python writes its bytecode caches (__pycache__/, ignored by git) even where the environment says
# not to (this machine sets PYTHONDONTWRITEBYTECODE=1): without them every process of the suite
# compiles gpufleet's modules again, 0.2 CPU-s of each CLI start's 0.8 (measured).
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.gpufleet-installed
TOOLS := .tools/bin

.PHONY: demo test check lint unit fuzz fmt docs goldens schemas bench bench-controlplane clean tools scan \
	controlplane image prepared measured coverage coverage-report compat gpu-prep \
	mutation horovod

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt $$(grep '^uv==' constraints.txt)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# helm for the chart tests: from PATH, or fetched once into .tools/bin (scripts/get-helm.sh);
# promtool and prometheus for the metrics tests: the Debian package (scripts/get-prometheus.sh);
# alertmanager and amtool for the alert-routing tests: the Debian package (scripts/get-alertmanager.sh);
# Zabbix 6.0 (server, frontend, PostgreSQL) for the Zabbix template's tests (scripts/get-zabbix.sh).
tools:
	bash scripts/get-helm.sh $(TOOLS)
	bash scripts/get-prometheus.sh
	bash scripts/get-alertmanager.sh
	bash scripts/get-zabbix.sh
	bash scripts/get-chromium.sh
	bash scripts/get-node-packages.sh

# Horovod for spec.framework horovod, built from its sdist for the venv's torch with the upstream
# fixes of patches/horovod/ (scripts/build-horovod.sh: ~3.5 min of 2 cores cold, then the wheel
# is kept in ~/.cache/gpufleet/horovod and this is a no-op), and installed into the venv.
horovod: $(STAMP)
	bash scripts/build-horovod.sh install $(VENV)

# The local control plane (etcd, kube-*, kwok, Kueue, JobSet, Kubeflow operators, Volcano) and a
# real node's components (kubelet, kube-proxy, containerd, runc, CNI plugins, CoreDNS, pause),
# built with Go from controlplane/ into .tools/controlplane (scripts/build-controlplane.sh: ~13
# min cold on 2 cores for the control plane, ~6 more for a node's, then cached).
controlplane:
	bash scripts/get-node-packages.sh
	bash scripts/build-controlplane.sh

# The worker image's CPU flavor, built here with buildah on a Debian base made by debootstrap
# (no registry, no Docker engine), as an OCI archive for `ctr -n k8s.io images import`, kept
# outside the clone in ~/.cache/gpufleet/images (GPUFLEET_IMAGE_CACHE); a no-op when the
# sources did not change (scripts/build-image.sh).
image:
	bash scripts/build-image.sh cpu

# The image's SBOM scanned for known vulnerabilities with grype, built from controlplane/sbom
# (scripts/scan-image.sh): needs grype's database at hand, which this machine cannot fetch
# (docs/security.md, "The image's bill of materials"); not part of `make test`.
scan:
	bash scripts/scan-image.sh

demo: $(STAMP)
	$(BIN)/gpufleet run examples/digits.yaml --fresh
	$(BIN)/python examples/serve_and_bench.py

# mypy's cache outside the clone, as Go's and the image's are (GPUFLEET_MYPY_CACHE): a new clone
# checks in 2 s instead of 34 (mypy compares each file's hash where its path or mtime differ);
# SQLite, so that two clones may check at once.
MYPY_CACHE ?= $(or $(GPUFLEET_MYPY_CACHE),$(HOME)/.cache/gpufleet/mypy)
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/ruff format --check src tests benchmarks scripts examples
	$(BIN)/mypy --sqlite-cache --cache-dir "$(MYPY_CACHE)"
	$(BIN)/python scripts/gen_spec_docs.py --check
	$(BIN)/python scripts/gen_zabbix_template.py --check

# One pytest-xdist worker per core: the test modules are handed out whole, the control plane's
# together, all of tests/cluster/ (tests/conftest.py, work_unit; tests/README.md).
# PYTEST_WORKERS=0 runs them in this one process.
PYTEST_WORKERS ?= auto
# PYTEST_ARGS: which tests (default: all), e.g. make measured PYTEST_ARGS=tests/unit
PYTEST_ARGS ?=
# The images are for the real-node tests, which need root (they skip otherwise): gpufleet's, and a
# team's own with gpufleet added (docs/images.md; ~2 min after a change in src/). Built as root
# only, beside the control plane (`tools` has installed what both need): from cold, their
# downloads and disk work overlap the Go builds' CPU; no-ops when nothing changed. Log follows.
IMAGE_LOG := .tools/image-build.log
test: prepared
	$(MAKE) --no-print-directory measured

prepared: lint tools horovod
	mkdir -p .tools; image=; \
	if [ "$$(id -u)" = 0 ]; then { bash scripts/build-image.sh cpu && \
	  bash scripts/build-image.sh own; } > $(IMAGE_LOG) 2>&1 & image=$$!; \
	else echo "make test: image not built (not root; the real-node tests skip)"; fi; \
	bash scripts/build-controlplane.sh; built=$$?; \
	if [ -n "$$image" ]; then wait $$image; made=$$?; sed 's/^/image: /' $(IMAGE_LOG); \
	  [ $$made = 0 ] || exit $$made; fi; exit $$built

# The suite under coverage.py: every test process, and every process that the tests of the
# distributed parts start (tests/support/coverage.py; `make coverage`: of all tests), combined
# into one report per package, HTML in .coverage-html/, failing under the floors in
# pyproject.toml (scripts/coverage_report.py; docs/coverage.md). The report runs after failed
# tests too; the tests' status wins.
COVERAGE_DATA := $(CURDIR)/.coverage-data
COV := COVERAGE_FILE=$(COVERAGE_DATA)/cov $(BIN)/coverage
measured:
	rm -rf $(COVERAGE_DATA) && mkdir -p $(COVERAGE_DATA)
	status=0; PATH="$(CURDIR)/$(TOOLS):$$PATH" $(COV) run -m pytest -q -n $(PYTEST_WORKERS) \
	  --durations=25 $(PYTEST_ARGS) || status=$$?; \
	$(MAKE) --no-print-directory coverage-report; report=$$?; \
	[ $$status = 0 ] || exit $$status; exit $$report

coverage: prepared
	GPUFLEET_COVERAGE_SCOPE=all $(MAKE) --no-print-directory measured

coverage-report: $(STAMP)
	$(COV) combine -q
	$(COV) html -q --fail-under=0
	$(COV) json -q --fail-under=0 -o $(COVERAGE_DATA)/coverage.json
	$(BIN)/python scripts/coverage_report.py $(COVERAGE_DATA)/coverage.json

# Mutation testing of the parts where a silent wrong result would hurt most ([tool.mutmut] in
# pyproject.toml; docs/coverage.md): resumable, mutants/ keeps each mutant's verdict; the score
# per module (scripts/mutation_score.py; --record writes benchmarks/results/mutation_*).
MUTATION_CHILDREN ?= 2
mutation: $(STAMP)
	$(BIN)/mutmut run --max-children $(MUTATION_CHILDREN)
	$(BIN)/mutmut export-cicd-stats
	$(BIN)/python scripts/mutation_score.py

# What scripts/gpu-check.sh carries to a lent GPU machine (.gpu-carry/; docs/development.md,
# "On a lent GPU"): gpufleet's wheel and what the device lacks, for its Python. Not part of
# `make test`, which tests it.
gpu-prep: $(STAMP)
	bash scripts/gpu-prep.sh

# The core of the suite (spec, runtime, launch, local resume, chaos) against another torch than
# the pinned one, in its own venv .compat/torch-<version> (scripts/compat.sh), recorded in
# benchmarks/results/compat-torch-<version>_*; not part of `make test`. E.g. TORCH=2.8.0 (the
# floor of pyproject's range) or the newest release.
TORCH ?=
compat: $(STAMP)
	PATH="$(CURDIR)/$(TOOLS):$$PATH" bash scripts/compat.sh "$(TORCH)"

# The inner loop while working (tests/README.md, "The budget": at most 5 minutes warm): lint, the
# tools and the control plane (what a fast test needs: helm, the CRDs; warm, copies from their
# caches), then the tests of tests/unit and tests/integration not marked `slow`, one pytest-xdist
# worker per core, without coverage. CI, and a change before it lands, run `make test`.
check: lint tools controlplane
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not slow" \
	  tests/unit tests/integration $(PYTEST_ARGS)

unit: $(STAMP) tools
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/python -m pytest -q tests/unit

# The property tests with new random examples, and the chaos tests with a new seed, on every run
# (`make test` draws the same ones each time: hypothesis profile "ci", a fixed chaos seed); a
# failing example is printed and kept in .hypothesis/ to replay, a chaos failure prints its seed.
fuzz: $(STAMP) tools
	HYPOTHESIS_PROFILE=explore PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/python -m pytest -q -m hypothesis
	GPUFLEET_CHAOS_SEED=$$($(BIN)/python -c 'import random; print(random.randrange(10**6))') \
	  $(BIN)/python -m pytest -q tests/chaos

fmt: $(STAMP)
	$(BIN)/ruff format src tests benchmarks scripts examples
	$(BIN)/ruff check --fix src tests benchmarks scripts examples

# The documentation set (mkdocs.yml): docs/spec.md generated from the spec's models, then the
# site built into build/docs, strict: a broken link or anchor fails (tests/unit/test_docs.py).
docs: $(STAMP)
	$(BIN)/python scripts/gen_spec_docs.py
	$(BIN)/mkdocs build

# Rewrite tests/golden/* from the renderers after an intended change; review with git diff.
goldens: $(STAMP)
	$(BIN)/python -m tests.support.goldens

# Rewrite tests/k8s-schemas/* from the CRDs of the pinned controllers after a pin changes.
schemas: $(STAMP) controlplane
	$(BIN)/python -m tests.support.k8s_schemas

bench: $(STAMP)
	$(BIN)/python benchmarks/runtime_overhead.py
	$(BIN)/python benchmarks/exporter_scrape.py
	$(BIN)/python benchmarks/inference.py

# The local control plane at work: up time, memory, queued vs plain jobs, a 50-node fleet run
# (~8 min; results in benchmarks/results/controlplane_*).
bench-controlplane: $(STAMP) tools controlplane
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/python benchmarks/controlplane.py

clean:
	rm -rf $(VENV) .gpufleet .mypy_cache .ruff_cache .pytest_cache .tools .coverage-data \
	  .coverage-html mutants
