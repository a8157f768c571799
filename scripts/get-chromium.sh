#!/usr/bin/env bash
# Debian's Chromium for the dashboard's browser tests (tests/integration/test_dashboard_browser.py,
# driven by Playwright with executable_path /usr/bin/chromium: Playwright's own browser download
# is not used). Installed with apt-get when run as root on Debian, only when missing; otherwise
# it says what to install, and those tests skip with that reason.
set -euo pipefail
if dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q 'ok installed'; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || [ ! -e /etc/debian_version ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "get-chromium: install Debian's chromium to run the dashboard's browser tests" >&2
  exit 0
fi
# shellcheck source=scripts/apt-lib.sh
source "$(dirname "$0")/apt-lib.sh"
apt_install chromium fonts-dejavu-core
/usr/bin/chromium --version
