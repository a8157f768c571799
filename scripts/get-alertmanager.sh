#!/usr/bin/env bash
# Alertmanager and amtool for the alert-routing tests: Debian's package prometheus-alertmanager
# (0.25 in bookworm), installed with apt-get when run as root on Debian/Ubuntu, as
# scripts/get-prometheus.sh installs Prometheus. Debian's build reads its notification templates
# from /usr/share/prometheus/alertmanager, so the binary alone would not do. The package's init
# script is kept from starting a daemon (policy-rc.d, Debian's switch for that) — the tests
# start their own on 127.0.0.1. Otherwise it says how, and those tests skip with that reason.
set -euo pipefail
if command -v amtool >/dev/null 2>&1 &&
  { command -v prometheus-alertmanager || command -v alertmanager; } >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "get-alertmanager: install the 'prometheus-alertmanager' package (0.25 or newer) to run the alert-routing tests" >&2
  exit 0
fi
# shellcheck source=scripts/apt-lib.sh
source "$(dirname "$0")/apt-lib.sh"
apt_install prometheus-alertmanager
amtool --version 2>&1 | head -1
