#!/usr/bin/env bash
# The Debian packages real nodes (`gpufleet cluster up --real-nodes`) need beside what the
# project builds: nftables (kube-proxy's and the CNI plugins' rules; `nft`), ipset and iptables
# (kube-router's network policies), libseccomp-dev
# (runc is built with seccomp, scripts/build-controlplane.sh) and buildah (the pause image,
# make image). Installs what is missing as root (CI starts from a fresh machine); otherwise
# says what, and the real-node tests skip when not root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/image-lib.sh
source scripts/image-lib.sh
if [ "$(id -u)" != 0 ]; then
  echo "get-node-packages: real nodes need root and the packages nftables, ipset, iptables, libseccomp-dev, buildah" >&2
  exit 0
fi
need_debs nftables libseccomp-dev buildah iproute2 ipset iptables
