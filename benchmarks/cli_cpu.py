"""What one cluster command costs in CPU: `gpufleet status`, `logs` and `cancel` of a job that is
not there, against an API server stand-in on 127.0.0.1 that answers every request 404 (so each
command makes its real calls and ends at once), as gpufleet runs them now (the built-in APIs
through the client's ApiClient, cluster/builtin.py) against the baseline in the same run: the
same command in a process that first imports the typed API classes the cluster commands used
before (CoreV1Api, AppsV1Api, PolicyV1Api, AutoscalingV2Api). A `python -c pass` row is the
interpreter's own start.

    python benchmarks/cli_cpu.py [--rounds 5]

CPU is each child's own (user + system, from wait4). Writes
benchmarks/results/cli-cpu_<hardware>_<date>.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, environment_section, median, result_path

TYPED = ("CoreV1Api", "AppsV1Api", "PolicyV1Api", "AutoscalingV2Api")
BASELINE = (
    "import sys, kubernetes.client as c; [getattr(c, n) for n in {typed}]; "
    "from gpufleet.cli.main import main; sys.argv = ['gpufleet', *sys.argv[1:]]; main()"
)
COMMANDS = (("status", "absent"), ("logs", "absent"), ("cancel", "absent"))


class NotFound(BaseHTTPRequestHandler):
    """Every request: 404 with a Status body, as an API server says of an absent object."""

    def _answer(self) -> None:
        body = json.dumps({"kind": "Status", "code": 404, "message": "not found"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


def kubeconfig(path: Path, port: int) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench",
                                                   "namespace": "default"}}],
    }))  # fmt: skip
    return path


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """The child's own CPU-seconds (user + system)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return float(usage.ru_utime + usage.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "KUBECONFIG": str(kubeconfig(Path(tmp) / "config",
                                                           server.server_address[1]))}  # fmt: skip
        ways = {
            "now": [sys.executable, "-m", "gpufleet.cli.main"],
            "typed APIs imported": [sys.executable, "-c", BASELINE.format(typed=list(TYPED))],
        }
        samples: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            samples.setdefault("python -c pass", []).append(cpu_of([sys.executable, "-c", "pass"],
                                                                   env))  # fmt: skip
            for command in COMMANDS:
                for way, argv in ways.items():
                    samples.setdefault(f"{command[0]} ({way})", []).append(
                        cpu_of([*argv, *command], env))  # fmt: skip
    server.shutdown()
    server.server_close()
    rows = {k: median(v) for k, v in samples.items()}
    lines = ["# What a cluster command costs in CPU (benchmarks/cli_cpu.py)", "",
             f"Median of {args.rounds} rounds, each command's own CPU-seconds (user + system); "
             "the API server a stand-in answering 404, so each command makes its calls and "
             "ends.", "", "| command | now (CPU-s) | typed APIs imported (CPU-s) | ratio |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for command, _ in COMMANDS:
        now, typed = rows[f"{command} (now)"], rows[f"{command} (typed APIs imported)"]
        lines.append(f"| `gpufleet {command}` | {now:.2f} | {typed:.2f} | {now / typed:.2f} |")
    lines += ["", f"`python -c pass`: {rows['python -c pass']:.2f} CPU-s.", "",
              *environment_section(environment())]  # fmt: skip
    out = result_path("cli-cpu")
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps({"samples": samples, "medians": rows}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
