#!/usr/bin/env bash
# Zabbix 6.0 for the Zabbix integration tests (tests/support/zabbix.py): Debian's packages
# zabbix-server-pgsql (the server and its PostgreSQL schema) and zabbix-frontend-php (the PHP
# frontend, whose API the tests call), PHP 8.2 to serve that frontend with php -S, and
# PostgreSQL when no initdb is installed; the tests start all of them on 127.0.0.1 and unix
# sockets in a temp dir. Installed with apt-get when run as root on Debian (bookworm's names),
# only what is missing. php8.2-cgi is named so that apt satisfies the frontend's "php"
# dependency with it rather than with Apache's libapache2-mod-php. No package's init script
# may start a daemon (policy-rc.d, Debian's switch for that). Otherwise it says which packages
# to install, and those tests skip with that reason.
set -euo pipefail
wanted=(zabbix-server-pgsql zabbix-frontend-php php8.2-cli php8.2-cgi php8.2-pgsql)
missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
    missing+=("$pkg")
  fi
done
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  missing+=(postgresql)
fi
if [ "${#missing[@]}" = 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || [ ! -e /etc/debian_version ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "get-zabbix: install ${missing[*]} (Debian 12 package names) to run the Zabbix tests" >&2
  exit 0
fi
# shellcheck source=scripts/apt-lib.sh
source "$(dirname "$0")/apt-lib.sh"
apt_install "${missing[@]}"
/usr/sbin/zabbix_server -V | head -1
