"""What ``cluster up`` started, recorded in its directory (``state.json``): pids and ports by
component, in the order they started, and the API server's URL."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.procs import pid_alive

DEFAULT_DIR = Path(".gpufleet/cluster")
STATE_FILE = "state.json"


@dataclass
class State:
    """What ``up`` started: pids and ports by component, the API server's URL."""

    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    server: str = ""
    binaries: str = ""  # where the components' executables are (to recognise our processes)
    started: list[str] = field(default_factory=list)  # component names in start order
    complete: bool = False  # every component started and ready (``up`` ended well)

    @classmethod
    def read(cls, directory: Path) -> State | None:
        """The state recorded in ``directory``; None when there is none or it is unreadable."""
        try:
            data = json.loads((directory / STATE_FILE).read_text())
            pids = dict(data["pids"])
            return cls(
                pids=pids,
                ports=dict(data["ports"]),
                server=str(data["server"]),
                binaries=str(data.get("binaries", "")),
                complete=bool(data.get("complete", False)),
                # A state written before the order was recorded: the build's order.
                started=[str(n) for n in data.get("started") or _in_build_order(pids)],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record(self, name: str, pid: int) -> None:
        """Component ``name`` runs as ``pid`` (started again: the same place in the order)."""
        self.pids[name] = pid
        if name not in self.started:
            self.started.append(name)

    def alive(self, name: str) -> bool:
        """Whether component ``name`` still runs: its pid is alive and is still our binary (a
        pid of a long-dead component may have been given to another program since)."""
        pid = self.pids.get(name)
        if pid is None or not pid_alive(pid):
            return False
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
        except OSError:
            return False
        # A node's component runs one binary per node: "kubelet@real-node-0" is the kubelet.
        return argv0 == str(Path(self.binaries) / name.partition("@")[0])

    def write(self, directory: Path) -> None:
        """Record the state in ``directory`` (pretty JSON, keys sorted)."""
        path = directory / STATE_FILE
        path.write_text(json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n")

    def remove(self, directory: Path) -> None:
        """Forget the state (after ``down``)."""
        (directory / STATE_FILE).unlink(missing_ok=True)


def _in_build_order(pids: dict[str, int]) -> list[str]:
    from gpufleet.devcluster.build import COMPONENTS

    return [n for n in COMPONENTS if n in pids]
