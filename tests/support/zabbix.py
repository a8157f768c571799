"""A real Zabbix 6.0 (Debian's packages, scripts/get-zabbix.sh) for the tests: its own
PostgreSQL cluster, zabbix_server and the PHP frontend's JSON-RPC API, on 127.0.0.1 and unix
sockets, every file under one directory."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpufleet.net import free_ports
from tests.support.procs import poll_until, stop_processes

T = TypeVar("T")

SCHEMA = Path("/usr/share/zabbix-server-pgsql")
FRONTEND = Path("/usr/share/zabbix")
SERVER = shutil.which("zabbix_server") or shutil.which("zabbix_server", path="/usr/sbin")
PHP = shutil.which("php")
# Debian installs PostgreSQL off PATH, one directory per major version (take the newest); an
# initdb on PATH may be a lone symlink into such a directory, which has psql and pg_isready.
_INITDB = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
_ON_PATH = shutil.which("initdb")
PG_BIN = (Path(_ON_PATH).resolve() if _ON_PATH else _INITDB[-1] if _INITDB else Path("/-")).parent
# Debian's frontend reads this file, not <frontend>/conf/zabbix.conf.php (CConfigFile).
CONFIG_CLASS = FRONTEND / "include/classes/core/CConfigFile.php"
CONFIG_PATH = "'/etc/zabbix/zabbix.conf.php'"
SQL_FILES = ("schema", "images", "data")


def _missing() -> list[str]:
    wanted: dict[str, object] = {
        "zabbix_server": SERVER, "php": PHP, "initdb": (PG_BIN / "initdb").exists(),
        "zabbix-server-pgsql schema": all((SCHEMA / f"{n}.sql.gz").exists() for n in SQL_FILES),
        "zabbix-frontend-php": CONFIG_CLASS.exists(),
        "user postgres": os.geteuid() != 0 or _user_exists("postgres"),
    }  # fmt: skip
    return [name for name, found in wanted.items() if not found]


def _user_exists(name: str) -> bool:
    try:
        return bool(pwd.getpwnam(name))
    except KeyError:
        return False


MISSING = _missing()
needs_zabbix = pytest.mark.skipif(
    bool(MISSING), reason=f"{', '.join(MISSING)} not installed (make tools: scripts/get-zabbix.sh)"
)
PG_PORT = 5432  # names the socket file only; explicit, so that no PGPORT in the environment counts


class ZabbixAPIError(RuntimeError):
    """An error answer of the JSON-RPC API; ``data`` says what the API disliked."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        self.code, self.data = error.get("code"), error.get("data", "")
        super().__init__(f"Zabbix API {method}: {error.get('message')} {self.data}")


@dataclass
class Zabbix:
    """The running stack: its API (as Admin), the server's trapper port and log."""

    api_url: str
    server_port: int
    log: Path
    _auth: str | None = field(default=None, repr=False)
    _ids: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def call(self, method: str, params: Any) -> Any:
        """The result of API ``method``; logs in as Admin on first use. 6.0 refuses the auth
        field on the methods that need none (apiinfo.version, user.login)."""
        if method in ("apiinfo.version", "user.login"):
            return self._rpc(method, params, None)
        if self._auth is None:
            self._auth = self._rpc("user.login", {"username": "Admin", "password": "zabbix"}, None)
        return self._rpc(method, params, self._auth)

    def _rpc(self, method: str, params: Any, auth: str | None) -> Any:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params,
                                "id": next(self._ids)}  # fmt: skip
        if auth is not None:
            body["auth"] = auth
        request = urllib.request.Request(
            self.api_url, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json-rpc"},
        )  # fmt: skip
        with _DIRECT.open(request, timeout=60) as resp:
            text = resp.read()
        try:
            answer = json.loads(text)
        except ValueError:  # a PHP error page, say
            raise RuntimeError(f"Zabbix API {method}: not JSON-RPC: {text[:2000]!r}") from None
        if "error" in answer:
            raise ZabbixAPIError(method, answer["error"])
        return answer["result"]


# Loopback needs no proxy, whatever http_proxy says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@contextmanager
def zabbix_stack(directory: Path) -> Iterator[Zabbix]:
    """PostgreSQL with Zabbix's schema, zabbix_server and the frontend, all started in
    ``directory`` and stopped on exit; yields their API (as Admin). An item's first value may
    take 5 s and more: a poller with nothing to poll sleeps 5 s before it looks again."""
    assert not MISSING, f"{', '.join(MISSING)} not installed (scripts/get-zabbix.sh)"
    # Unix socket paths have 107 bytes; the server's longest socket is this one.
    longest = directory / "zs" / "zabbix_server_preprocessing.sock"
    assert len(str(longest)) <= 107, f"{directory}: too long a path for the unix sockets in it"
    pg_dir = directory / "pg"  # the cluster's data and socket
    postgres = _start_postgres(pg_dir)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _create_database(pg_dir)
        server_port, web_port = free_ports(2)  # distinct, as two free_port() may not be
        server = _start_server(directory, pg_dir, server_port)
        procs.append(server)
        procs.append(_start_frontend(directory, pg_dir, server_port, web_port))
        zabbix = Zabbix(f"http://127.0.0.1:{web_port}/api_jsonrpc.php", server_port,
                        directory / "zabbix_server.log")  # fmt: skip
        _await(lambda: zabbix.call("apiinfo.version", []), "the Zabbix API",
               directory / "frontend.log", procs[-1], retry_on=(OSError,))  # fmt: skip
        # Its processes start in one burst once the configuration is loaded: the poller takes
        # HTTP agent items, the trapper answers the frontend.
        started = ("started [poller #1]", "started [trapper #1]")
        _await(lambda: all(s in _read(zabbix.log) for s in started), "zabbix_server",
               zabbix.log, server)  # fmt: skip
        yield zabbix
    finally:
        stop_processes(procs)
        _stop_postgres(postgres)


def _await(
    check: Callable[[], T | None],
    what: str,
    log: Path,
    proc: subprocess.Popen[bytes],
    timeout: float = 120,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """poll_until, failing with the tail of ``log`` (why the server did not come up)."""
    try:
        return poll_until(check, what=what, timeout=timeout, alive=proc, retry_on=retry_on)
    except pytest.fail.Exception as e:
        pytest.fail(f"{e}\n--- last lines of {log}:\n{_tail(log)}")


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(_read(path).splitlines()[-lines:])


def _as_postgres() -> list[str]:
    """The prefix that runs a PostgreSQL command: as root, as the user postgres (PostgreSQL
    refuses root). pytest's base temp is root's and 0700, so that user may pass through
    directories (CAP_DAC_READ_SEARCH, kept across exec as an ambient capability) but owns only
    its own. setpriv execs: the Popen is postgres itself, which a signal then reaches (runuser
    forks and swallows SIGINT, the fast shutdown)."""
    if os.geteuid() != 0:
        return []
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
            *(caps if _bounding_cap(2) else []), "--"]  # fmt: skip


def _bounding_cap(bit: int) -> bool:
    """Whether this process may raise capability ``bit`` (containers may drop some)."""
    status = Path("/proc/self/status").read_text()
    match = re.search(r"^CapBnd:\s*([0-9a-f]+)$", status, re.M)
    return bool(match and int(match[1], 16) >> bit & 1)


def _start_postgres(pg_dir: Path) -> subprocess.Popen[bytes]:
    """A fresh cluster in ``pg_dir``/data, listening only on a socket in ``pg_dir``; durability
    off (a test's database dies with it)."""
    pg_dir.mkdir(parents=True)
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(pg_dir, user.pw_uid, user.pw_gid)
    log, data, sock = pg_dir.parent / "postgres.log", str(pg_dir / "data"), str(pg_dir)
    initdb = [str(PG_BIN / "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync",
              "--no-locale", "-E", "UTF8", "--no-instructions"]  # fmt: skip
    server = [str(PG_BIN / "postgres"), "-D", data, "-k", sock, "-p", str(PG_PORT),
              "-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
              "-c", "full_page_writes=off"]  # fmt: skip
    with log.open("wb") as out:
        done = subprocess.run([*_as_postgres(), *initdb], stdout=out, stderr=subprocess.STDOUT,
                              cwd=pg_dir, timeout=120, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb exited {done.returncode}:\n{_tail(log)}")
        proc = subprocess.Popen([*_as_postgres(), *server], stdout=out, stderr=subprocess.STDOUT,
                                cwd=pg_dir)  # fmt: skip
    ready = [str(PG_BIN / "pg_isready"), "-q", "-h", sock, "-p", str(PG_PORT), "-U", "postgres"]
    try:
        _await(lambda: subprocess.run(ready, timeout=10).returncode == 0, "PostgreSQL", log, proc)
    except BaseException:
        _stop_postgres(proc)
        raise
    return proc


def _stop_postgres(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT is PostgreSQL's fast shutdown (what pg_ctl stop -m fast sends): clients are cut
    off, the cluster is left consistent."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _psql(pg_dir: Path, user: str, database: str) -> list[str]:
    return [str(PG_BIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(pg_dir),
            "-p", str(PG_PORT), "-U", user, "-d", database]  # fmt: skip


def _create_database(pg_dir: Path) -> None:
    """The role and database zabbix, with Zabbix's schema, images and initial data (Admin,
    the templates), loaded in one psql session. The stock host "Zabbix server" is disabled: it
    polls an agent on 127.0.0.1:10050, which is none of the test's (or nothing)."""
    _run_sql(
        _psql(pg_dir, "postgres", "postgres"),
        b"CREATE ROLE zabbix LOGIN; CREATE DATABASE zabbix OWNER zabbix ENCODING 'UTF8';",
    )
    sql = [gzip.decompress((SCHEMA / f"{name}.sql.gz").read_bytes()) for name in SQL_FILES]
    disable = b"UPDATE hosts SET status = 1 WHERE host = 'Zabbix server';\n"
    _run_sql(_psql(pg_dir, "zabbix", "zabbix"), sql[0] + sql[1] + _one_query(sql[2]) + disable)


def _run_sql(argv: list[str], sql: bytes) -> None:
    done = subprocess.run(argv, input=sql, capture_output=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[-1]}: psql exited {done.returncode}: {done.stderr[-3000:]!r}")


# Standard SQL string literals ('' inside is two literals in a row) and statement ends.
_LITERAL_OR_END = re.compile(rb"'[^']*'|;")


def _one_query(sql: bytes) -> bytes:
    """``sql`` sent as one multi-statement query: psql sends data.sql's ~130,000 INSERTs one
    round trip each otherwise (10 s; this way 3 s). psql's "\\;" ends a statement without
    sending it. data.sql quotes only with '...' (no E'', $$ or comments), which this skips."""
    joined = _LITERAL_OR_END.sub(lambda m: b"\\;" if m[0] == b";" else m[0], sql)
    return joined + b";\n"


def _start_server(directory: Path, pg_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """zabbix_server in the foreground with the fewest processes 6.0 allows. As root it stays
    root (AllowRoot): as its user zabbix it could not enter pytest's 0700 base temp."""
    assert SERVER
    assert port <= 32767, f"ListenPort {port} is out of the server's range (1024-32767)"
    sockets = directory / "zs"  # between its processes
    sockets.mkdir()
    options = {
        "DBHost": pg_dir, "DBPort": PG_PORT, "DBName": "zabbix", "DBUser": "zabbix",
        # To stdout, into zabbix_server.log, like its complaints about the config file.
        "LogType": "console", "PidFile": directory / "zabbix_server.pid", "SocketDir": sockets,
        "ListenIP": "127.0.0.1", "ListenPort": port, "AllowRoot": int(os.geteuid() == 0),
        # New hosts and items reach the configuration cache within a second, not a minute;
        # no housekeeping deletes what a test reads.
        "CacheUpdateFrequency": 1, "HousekeepingFrequency": 0,
        # Pollers take HTTP agent items in 6.0 (and need an unreachable poller); the trapper
        # serves the frontend; a history poller, calculated items. The rest are minimums, or
        # 0: no pings, discovery, web scenarios (HTTP pollers), ODBC, proxies.
        "StartPollers": 1, "StartPollersUnreachable": 1, "StartTrappers": 1,
        "StartPreprocessors": 1, "StartHistoryPollers": 1, "StartDBSyncers": 1,
        "StartLLDProcessors": 1, "StartAlerters": 1, "StartEscalators": 1, "StartTimers": 1,
        "StartPingers": 0, "StartDiscoverers": 0, "StartHTTPPollers": 0, "StartODBCPollers": 0,
        "StartProxyPollers": 0,
    }  # fmt: skip
    config = directory / "zabbix_server.conf"
    config.write_text("".join(f"{key}={value}\n" for key, value in options.items()))
    # libcurl (HTTP agent items) would send loopback requests to a proxy from the environment.
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    with (directory / "zabbix_server.log").open("wb") as out:
        return subprocess.Popen([SERVER, "-f", "-c", str(config)], cwd=directory, env=env,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def _start_frontend(
    directory: Path, pg_dir: Path, server_port: int, port: int
) -> subprocess.Popen[bytes]:
    """PHP's built-in server on the installed frontend, neither copied nor changed (symlinks
    would not do: it finds its root by realpath, and Debian's reads its settings from
    /etc/zabbix whatever the root). A prepended script defines CConfigFile, before the
    frontend's autoloader would, from its own source with the settings file being ours."""
    assert PHP
    web = directory / "frontend"
    web.mkdir()
    (web / "zabbix.conf.php").write_text(FRONTEND_CONF % (_php(str(pg_dir)), PG_PORT, server_port))
    (web / "prepend.php").write_text(PREPEND % (_php(str(CONFIG_CLASS)), _php(CONFIG_PATH)))
    with (directory / "frontend.log").open("wb") as out:
        return subprocess.Popen(
            [PHP, "-d", f"auto_prepend_file={web / 'prepend.php'}", "-S", f"127.0.0.1:{port}",
             "-t", str(FRONTEND)],
            cwd=directory, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


FRONTEND_CONF = """<?php
$DB['TYPE'] = 'POSTGRESQL';
$DB['SERVER'] = %s;
$DB['PORT'] = '%d';
$DB['DATABASE'] = 'zabbix';
$DB['USER'] = 'zabbix';
$DB['PASSWORD'] = '';
$DB['SCHEMA'] = '';
$DB['DOUBLE_IEEE754'] = true;
$ZBX_SERVER = '127.0.0.1';
$ZBX_SERVER_PORT = '%d';
$ZBX_SERVER_NAME = 'gpufleet-test';
$IMAGE_FORMAT_DEFAULT = IMAGE_FORMAT_PNG;
"""
PREPEND = """<?php
if (!class_exists('CConfigFile', false)) {
    $source = file_get_contents(%s);
    $ours = var_export(__DIR__.'/zabbix.conf.php', true);
    $source = str_replace(%s, $ours, $source, $count);
    if ($count !== 1) {
        exit('tests/support/zabbix.py: CConfigFile.php names no /etc/zabbix/zabbix.conf.php');
    }
    eval('?>'.$source);
}
"""


def _php(value: str) -> str:
    """``value`` as a single-quoted PHP string."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
