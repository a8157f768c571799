# shellcheck shell=bash
# Sourced by scripts/get-prometheus.sh, get-alertmanager.sh, get-zabbix.sh and get-chromium.sh:
# installs Debian packages for the tests that start real servers or a browser (the tests start
# their own, on 127.0.0.1).

# apt_install PKG...: install with apt-get, no recommends, with no package's init script
# starting a daemon (policy-rc.d exiting 101, Debian's switch for that, unless the machine has
# one already; removed afterwards).
apt_install() {
  local policy=/usr/sbin/policy-rc.d made=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
    made=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  local rc=0
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; } || rc=$?
  if [ -n "$made" ]; then rm -f "$policy"; fi
  return "$rc"
}
