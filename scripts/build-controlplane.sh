#!/usr/bin/env bash
# Build the local control plane's components from the pinned Go module in controlplane/ into
# .tools/controlplane/ (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy, kwok, Kueue, JobSet, the MPI operator, the Kubeflow Trainer, and CoreDNS from
# controlplane/coredns/main.go); the Kubeflow training-operator, Volcano and KubeRay from modules
# of their own, controlplane/<name>/, because their Kubernetes libraries are older; and a real node's
# containerd, runc and CNI plugins from theirs, kube-router (network policies), Prometheus and
# Prometheus Adapter (custom metrics for autoscalers) and versitygw (the tests' S3 server) from
# their own. A binary newer than its go.mod, go.sum and own source is kept; Go's build cache
# makes a rebuild after a pin change incremental. Go caches compiled packages, not linked
# binaries: each binary is also kept outside the clone, in $GPUFLEET_BUILD_CACHE (default
# ~/.cache/gpufleet/controlplane), named by a hash of everything its build reads (this script,
# Go's version and environment, its module's go.mod and go.sum, its own source, the C compiler
# for cgo), and a new clone copies it from there instead of linking it again (2 of 2.3 minutes
# of a warm `make test`'s set-up on 2 cores, measured).
# Usage: [BINARIES_ONLY=1] scripts/build-controlplane.sh [NAME...]
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${DEST:-.tools/controlplane}"
mkdir -p "$DEST" && DEST=$(cd "$DEST" && pwd)
K8S_VERSION="v1.36.3"  # keep in step with k8s.io/kubernetes in controlplane/go.mod
# name -> main package (the tool lines of controlplane/go.mod)
declare -A PKGS=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kwok]=sigs.k8s.io/kwok/cmd/kwok
  [kueue]=sigs.k8s.io/kueue/cmd/kueue
  [jobset]=sigs.k8s.io/jobset
  [training-operator]=github.com/kubeflow/training-operator/cmd/training-operator.v1
  [mpi-operator]=github.com/kubeflow/mpi-operator/cmd/mpi-operator
  [trainer]=github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
  [vc-webhook-manager]=volcano.sh/volcano/cmd/webhook-manager
  [vc-controller-manager]=volcano.sh/volcano/cmd/controller-manager
  [vc-scheduler]=volcano.sh/volcano/cmd/scheduler
  # a real node's (issue 28): kubelet, kube-proxy, containerd with its runc shim and ctr,
  # runc, the CNI plugins the node's bridge network uses, CoreDNS
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [containerd]=github.com/containerd/containerd/v2/cmd/containerd
  [containerd-shim-runc-v2]=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  [ctr]=github.com/containerd/containerd/v2/cmd/ctr
  [runc]=github.com/opencontainers/runc
  [cni-bridge]=github.com/containernetworking/plugins/plugins/main/bridge
  [cni-loopback]=github.com/containernetworking/plugins/plugins/main/loopback
  [cni-host-local]=github.com/containernetworking/plugins/plugins/ipam/host-local
  [cni-portmap]=github.com/containernetworking/plugins/plugins/meta/portmap
  [coredns]=gpufleet.dev/controlplane/coredns  # controlplane/coredns/main.go: CoreDNS's plugins a cluster uses
  # the real nodes' NetworkPolicy enforcement (issue 29): kube-router's firewall alone
  [kube-router]=github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
  # the metrics pipeline's (issue 29): custom.metrics.k8s.io from Prometheus, for the HPA
  [prometheus-adapter]=sigs.k8s.io/prometheus-adapter/cmd/adapter
  [prometheus]=github.com/prometheus/prometheus/cmd/prometheus
  # Ray on Kubernetes (issue 30): the KubeRay operator (RayCluster, RayJob)
  [kuberay]=github.com/ray-project/kuberay/ray-operator
  # the tests' object store (issue 32): an S3 server with real S3 semantics on a directory
  [versitygw]=github.com/versity/versitygw/cmd/versitygw
  # secrets sealed offline and unsealed in the cluster (issue 55): the controller and kubeseal
  [sealed-secrets-controller]=github.com/bitnami/sealed-secrets/cmd/controller
  [kubeseal]=github.com/bitnami/sealed-secrets/cmd/kubeseal
  # the image's bill of materials (issue 55): syft (make image) and grype (make scan alone)
  [syft]=github.com/anchore/syft/cmd/syft
  [grype]=github.com/anchore/grype/cmd/grype
)
# name -> its Go module's directory, where it is not controlplane/ itself
declare -A MODULES=(
  [training-operator]=controlplane/training-operator
  [vc-webhook-manager]=controlplane/volcano
  [vc-controller-manager]=controlplane/volcano
  [vc-scheduler]=controlplane/volcano
  [containerd]=controlplane/containerd
  [containerd-shim-runc-v2]=controlplane/containerd
  [ctr]=controlplane/containerd
  [runc]=controlplane/runc
  [cni-bridge]=controlplane/cni-plugins
  [cni-loopback]=controlplane/cni-plugins
  [cni-host-local]=controlplane/cni-plugins
  [cni-portmap]=controlplane/cni-plugins
  [kube-router]=controlplane/kube-router
  [prometheus-adapter]=controlplane/prometheus-adapter
  [prometheus]=controlplane/prometheus
  [kuberay]=controlplane/kuberay
  [versitygw]=controlplane/versitygw
  [sealed-secrets-controller]=controlplane/sealed-secrets
  [kubeseal]=controlplane/sealed-secrets
  [syft]=controlplane/sbom
  [grype]=controlplane/sbom
)
# name -> the project's own Go source it is built from, where it has one
declare -A SOURCES=([coredns]=controlplane/coredns/main.go)
# A binary is up to date when it is newer than its module's go.mod and go.sum and its own source.
fresh() {
  local out=$1 module=$2 source=$3
  [ -x "$out" ] && [ "$out" -nt "$module/go.mod" ] && [ "$out" -nt "$module/go.sum" ] &&
    { [ -z "$source" ] || [ "$out" -nt "$source" ]; }
}
# name -> what its own Makefile builds it with, where that is more than a plain go build:
# containerd without btrfs (no headers here), static shim; runc with cgo and libseccomp.
# Prometheus with Kubernetes service discovery alone (its own build tags; Debian's package has
# none): the others' cloud SDKs would double its build.
declare -A TAGS=([containerd]=no_btrfs [ctr]=no_btrfs [runc]="seccomp urfave_cli_no_docs"
                 [prometheus]="remove_all_sd enable_kubernetes_sd")
declare -A CGO=([runc]=1 [containerd-shim-runc-v2]=0 [kube-router]=0 [prometheus-adapter]=0
                [prometheus]=0 [versitygw]=0 [sealed-secrets-controller]=0 [kubeseal]=0
                [syft]=0 [grype]=0)
declare -A VERSION_LDFLAGS=(
  [containerd]="-X github.com/containerd/containerd/v2/version.Version=v2.4.2"
  [containerd-shim-runc-v2]="-X github.com/containerd/containerd/v2/version.Version=v2.4.2"
  [ctr]="-X github.com/containerd/containerd/v2/version.Version=v2.4.2"
  [runc]="-X main.version=1.5.2"
  [coredns]="-X github.com/coredns/coredns/coremain.GitCommit=v1.14.2"
  [kube-router]="-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=v2.10.0"
  [prometheus]="-X github.com/prometheus/common/version.Version=3.16.0"
  [versitygw]="-X main.Version=v1.8.0"
  [sealed-secrets-controller]="-X main.VERSION=v0.40.0"
  [kubeseal]="-X main.VERSION=v0.40.0"
  [syft]="-X main.version=v1.57.2"
  [grype]="-X main.version=v0.121.3"
)
ORDER=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kueue jobset
       training-operator mpi-operator trainer vc-webhook-manager vc-controller-manager vc-scheduler
       kuberay kubelet kube-proxy containerd containerd-shim-runc-v2 ctr runc
       cni-bridge cni-loopback cni-host-local cni-portmap coredns kube-router prometheus
       prometheus-adapter versitygw sealed-secrets-controller kubeseal pause)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ORDER[@]}")

if ! command -v go >/dev/null 2>&1; then
  echo "build-controlplane: Go is not installed (the project's machines have Go 1.26)" >&2
  exit 2
fi
# The toolchain on the machine, never a downloaded one; no PGO (kube-apiserver ships a profile
# that would compile the shared packages a second time); paths trimmed for reproducible builds.
# No DWARF from the compiler (the linker's -s -w dropped it anyway) and the compiler's garbage
# collector run less often: Kueue from an empty build cache took 648 CPU-s instead of 737
# (-12 %; a binary of the same size; benchmarks/results/cold-make-test_*).
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -pgo=off -gcflags=all=-dwarf=false"
export GOGC=400
# Kueue and the Trainer need sigs.k8s.io/scheduler-library v0.1.0-alpha1, which the checksum database does not
# hold; its hash in controlplane/go.sum equals the one Kueue's own go.sum pins (checked).
export GONOSUMDB=sigs.k8s.io/scheduler-library
ldflags_k8s="-s -w \
  -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=36 \
  -X k8s.io/component-base/version.gitTreeState=clean \
  -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"

BUILD_CACHE="${GPUFLEET_BUILD_CACHE:-$HOME/.cache/gpufleet/controlplane}"
# What every build here reads besides its own inputs.
build_env=$( { sha256sum scripts/build-controlplane.sh; go version
  go env GOOS GOARCH GOAMD64 CGO_ENABLED CC CGO_CFLAGS CGO_LDFLAGS; } | sha256sum | cut -c1-64)
# The cached copy of component $1 (module $2, own source $3, cgo $4): its path, by its inputs.
cached() {
  local name=$1 module=$2 source=$3 cgo=$4 key
  key=$( { echo "$build_env $name $cgo"; sha256sum "$module/go.mod" "$module/go.sum";
    if [ -n "$source" ]; then sha256sum "$source"; fi
    if [ "$cgo" = 1 ]; then "${CC:-cc}" --version; fi; } | sha256sum | cut -c1-16)
  echo "$BUILD_CACHE/$name-$key"
}

# What is out of date, and the Go modules it is built from.
stale=() stale_modules=()
for name in "${names[@]}"; do
  [ "$name" != pause ] || continue
  if [ -z "${PKGS[$name]:-}" ]; then
    echo "build-controlplane: unknown component '$name' (one of: ${ORDER[*]})" >&2
    exit 2
  fi
  module="${MODULES[$name]:-controlplane}" out="$DEST/$name"
  if fresh "$out" "$module" "${SOURCES[$name]:-}"; then continue; fi
  stale+=("$name")
  [[ " ${stale_modules[*]} " == *" $module "* ]] || stale_modules+=("$module")
done
# Their modules downloaded first, every Go module at once: a `go build` fetches what it lacks
# while it loads packages, one component after another; measured from an empty module cache,
# all 700 modules of controlplane/ came down in 44 s in parallel.
if [ ${#stale_modules[@]} -gt 0 ]; then
  started=$(date +%s) pids=()
  for module in "${stale_modules[@]}"; do (cd "$module" && go mod download) & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid"; done
  echo "  Go modules of ${#stale[@]} components: downloaded in $(($(date +%s) - started)) s"
fi

for name in "${names[@]}"; do
  if [ "$name" = pause ]; then  # Kubernetes' own pause, from its module (no image to pull)
    out="$DEST/pause"
    src=$(cd controlplane && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
    if [ ! -x "$out" ] || [ "$src" -nt "$out" ] || [ controlplane/go.mod -nt "$out" ]; then
      ${CC:-cc} -Os -Wall -Werror -static -DVERSION=v3.10.2-gpufleet -o "$out.tmp" "$src"
      mv "$out.tmp" "$out" && echo "  pause: built"
    else
      echo "  pause: up to date"
    fi
    continue
  fi
  pkg="${PKGS[$name]}"  # known: checked above
  out="$DEST/$name"
  module="${MODULES[$name]:-controlplane}"
  if fresh "$out" "$module" "${SOURCES[$name]:-}"; then
    echo "  $name: up to date"
    continue
  fi
  started=$(date +%s)
  if [ "$module" = controlplane ] && [ -z "${VERSION_LDFLAGS[$name]:-}" ]; then
    flags="$ldflags_k8s"  # Kubernetes' own version flags, for its components
  else
    flags="-s -w ${VERSION_LDFLAGS[$name]:-}"
  fi
  cgo="${CGO[$name]:-$(go env CGO_ENABLED)}"
  copy=$(cached "$name" "$module" "${SOURCES[$name]:-}" "$cgo")
  if [ -x "$copy" ]; then
    cp "$copy" "$out.tmp" && mv "$out.tmp" "$out"
    echo "  $name: from $BUILD_CACHE"
    continue
  fi
  (cd "$module" && CGO_ENABLED="$cgo" \
     go build -tags "${TAGS[$name]:-}" -ldflags "$flags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  echo "  $name: built in $(($(date +%s) - started)) s ($(du -h "$out" | cut -f1))"
  # one copy per component: the older ones go
  mkdir -p "$BUILD_CACHE" && rm -f "$BUILD_CACHE/$name"-????????????????
  cp "$out" "$copy.tmp" && mv "$copy.tmp" "$copy"
done

# BINARIES_ONLY=1: the components named and nothing else (scripts/build-image.sh builds syft
# so, beside a full build of this script that `make test` runs at the same time).
if [ "${BINARIES_ONLY:-}" = 1 ]; then exit 0; fi

# kwok's own Stages (node and pod lifecycles), read from its module at the pinned version.
stages="$DEST/kwok-stages"
kwok_dir=$(cd controlplane && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
mkdir -p "$stages"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
         pod/general/pod-create.yaml pod/general/pod-init-container-running.yaml \
         pod/general/pod-init-container-completed.yaml pod/general/pod-ready.yaml \
         pod/general/pod-complete.yaml pod/general/pod-delete.yaml; do
  install -m 0644 "$kwok_dir/kustomize/stage/$f" "$stages/$(basename "$f")"
done

# The controllers' own install manifests (CRDs, RBAC, webhook configurations), rendered with
# kustomize from each module at the pinned version, as its `make deploy` would: name -> Go
# module directory, module path, kustomization inside it.
declare -A KUSTOMIZE=(
  [kueue]="controlplane sigs.k8s.io/kueue config/default"
  [jobset]="controlplane sigs.k8s.io/jobset config/default"
  [training-operator]="controlplane/training-operator github.com/kubeflow/training-operator manifests/overlays/standalone"
  [mpi-operator]="controlplane github.com/kubeflow/mpi-operator manifests/overlays/standalone"
  [kuberay]="controlplane/kuberay github.com/ray-project/kuberay/ray-operator config/default"
)
manifests="$DEST/manifests"
mkdir -p "$manifests"
kubectl_bin=$(command -v kubectl || echo .tools/bin/kubectl)
for name in kueue jobset training-operator mpi-operator kuberay; do
  read -r module path kustomization <<<"${KUSTOMIZE[$name]}"
  out="$manifests/$name.yaml"
  if [ -s "$out" ] && [ "$out" -nt "$module/go.mod" ] && [ "$out" -nt "$module/go.sum" ]; then
    continue
  fi
  dir=$(cd "$module" && go list -m -f '{{.Dir}}' "$path")
  "$kubectl_bin" kustomize "$dir/$kustomization" 2>/dev/null >"$out.tmp"
  mv "$out.tmp" "$out"
  echo "  $name manifests: $(grep -c '^kind: CustomResourceDefinition' "$out") CRDs"
done

# The Trainer's: its overlays/manager less the one line its own comment says to drop where JobSet
# is already installed (that line fetches JobSet's release manifests over the network), and its
# ClusterTrainingRuntimes (overlays/runtimes), applied once its webhooks answer.
out="$manifests/trainer.yaml"
if [ ! -s "$out" ] || [ ! -s "$manifests/trainer-runtimes.yaml" ] \
    || [ controlplane/go.sum -nt "$out" ] || [ controlplane/go.mod -nt "$out" ]; then
  dir=$(cd controlplane && go list -m -f '{{.Dir}}' github.com/kubeflow/trainer/v2)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp -r "$dir/manifests" "$work/" && chmod -R u+w "$work"
  grep -q '^  - ../../third-party/jobset' "$work/manifests/overlays/manager/kustomization.yaml" || {
    echo "build-controlplane: the Trainer's overlays/manager no longer names third-party/jobset" >&2
    exit 1
  }
  sed -i '/^  - ..\/..\/third-party\/jobset/d' "$work/manifests/overlays/manager/kustomization.yaml"
  "$kubectl_bin" kustomize "$work/manifests/overlays/runtimes" >"$manifests/trainer-runtimes.yaml"
  "$kubectl_bin" kustomize "$work/manifests/overlays/manager" >"$out.tmp"
  mv "$out.tmp" "$out"
  echo "  trainer manifests: $(grep -c '^kind: CustomResourceDefinition' "$out") CRDs," \
    "$(grep -c '^kind: ClusterTrainingRuntime' "$manifests/trainer-runtimes.yaml") runtimes"
fi

# Volcano's: the install manifest its module ships, rendered from its own Helm chart
# (installer/volcano-development.yaml).
out="$manifests/volcano.yaml"
if [ ! -s "$out" ] || [ controlplane/volcano/go.sum -nt "$out" ] || [ controlplane/volcano/go.mod -nt "$out" ]; then
  dir=$(cd controlplane/volcano && go list -m -f '{{.Dir}}' volcano.sh/volcano)
  install -m 0644 "$dir/installer/volcano-development.yaml" "$out"
  echo "  volcano manifests: $(grep -c '^kind: CustomResourceDefinition' "$out") CRDs"
fi

# Sealed Secrets': rendered from its module's own Helm chart (CRD, RBAC, Services, Deployment) as
# `helm install sealed-secrets-controller -n kube-system` would: kubeseal's default names.
out="$manifests/sealed-secrets.yaml"
if [ ! -s "$out" ] || [ controlplane/sealed-secrets/go.sum -nt "$out" ] \
    || [ controlplane/sealed-secrets/go.mod -nt "$out" ]; then
  dir=$(cd controlplane/sealed-secrets && go list -m -f '{{.Dir}}' github.com/bitnami/sealed-secrets)
  helm_bin=$(command -v helm || echo .tools/bin/helm)
  "$helm_bin" template sealed-secrets-controller "$dir/helm/sealed-secrets" --namespace kube-system \
    --include-crds >"$out.tmp"
  mv "$out.tmp" "$out"
  echo "  sealed-secrets manifests: $(grep -c '^kind: CustomResourceDefinition' "$out") CRDs"
fi

# CRDs of components not run here (Prometheus Operator, Volcano, KEDA, KServe), from their modules
# at the versions and hashes pinned in controlplane/crds.txt.
crds="$DEST/crds"
if [ ! -d "$crds" ] || [ controlplane/crds.txt -nt "$crds" ]; then
  rm -rf "$crds.tmp" && mkdir -p "$crds.tmp"
  grep -v '^#' controlplane/crds.txt | while read -r mod version sum files; do
    [ -n "$mod" ] || continue
    info=$(cd controlplane && go mod download -json "$mod@$version")
    got=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p')
    if [ "$got" != "$sum" ]; then
      echo "build-controlplane: $mod@$version has hash '$got', controlplane/crds.txt pins '$sum'" >&2
      exit 1
    fi
    dir=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    for f in $files; do install -m 0644 "$dir/$f" "$crds.tmp/$(basename "$f")"; done
  done
  rm -rf "$crds" && mv "$crds.tmp" "$crds"
  echo "  CRDs of other projects: $(ls "$crds" | wc -l) files"
fi
