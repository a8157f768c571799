#!/usr/bin/env bash
# Make promtool and prometheus available for the observability tests (Debian package
# "prometheus", which ships both). Installs with apt-get when run as root on Debian/Ubuntu;
# otherwise says how, and the tests that need them skip with that reason.
set -euo pipefail
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # shellcheck source=scripts/apt-lib.sh
  source "$(dirname "$0")/apt-lib.sh"
  apt_install prometheus
  promtool --version | head -1
else
  echo "get-prometheus: install the 'prometheus' package (promtool) to run the metrics tests" >&2
fi
