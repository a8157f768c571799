"""Horovod workers (spec.framework horovod): a user's unmodified Horovod PyTorch script, started
by torchrun's elastic agent as every worker is, over Horovod's Gloo controller.

What ``horovodrun --gloo`` gives each process, gpufleet gives it from torchrun's environment:
the HOROVOD_* slot variables (rank, size, local and cross ranks) and the address of Horovod's
Gloo rendezvous, an HTTP store (Horovod's own RendezvousHTTPServer) that rank 0 serves for the
group's attempt and publishes in the agents' store. A crashed rank
makes the agents restart the whole group (spec.maxRestarts); each attempt gets a new store, and
the script resumes from its own checkpoint. Importing this package imports neither torch nor
Horovod. Under mpirun (the mpijob target) Horovod's MPI controller is used and none of this is.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

# What every rank of a Horovod job gets, here and in pods (spec.env may set otherwise): no tensor
# fusion. Fused, tensors are batched by when they are ready, so with 3 ranks or more the order
# of a sum changes from run to run (two 4-rank runs here ended with other weights; unfused, the
# same, bit for bit), and a resume could not end with the uninterrupted run's weights.
HOROVOD_ENV = {"HOROVOD_FUSION_THRESHOLD": "0"}

# The key of the rendezvous address in the agents' store (the worker group's store, which
# torchrun names in MASTER_ADDR and MASTER_PORT), and how long a rank waits for rank 0's.
STORE_KEY = "gpufleet/horovod/rendezvous"
STORE_TIMEOUT = timedelta(minutes=5)  # as long as a rank may take to start, torch imported
PROBE_TIMEOUT, PROBE_INTERVAL = 2.0, 0.2  # seconds: is an address's server up
LOOPBACK = ("127.", "localhost", "::1")


class SlotError(ValueError):
    """torchrun's environment lacks what Horovod's slot variables are made of."""


def slot_env(env: Mapping[str, str]) -> dict[str, str]:
    """This worker's HOROVOD_* slot variables, as Horovod's gloo_run.create_slot_env_vars sets
    them, from torchrun's: ranks are torchrun's (node-major, as Horovod assigns them), the
    "host" is the node (its group rank), and a node's workers share it."""
    try:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank, local_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        node = int(env["GROUP_RANK"])
    except (KeyError, ValueError) as exc:
        missing = f"not started by torchrun's agent: {exc} is missing or not a number"
        raise SlotError(missing) from None
    return {
        "HOROVOD_HOSTNAME": f"node{node}",
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(node),
        "HOROVOD_CROSS_SIZE": str(size // local_size),
    }


def run_env(env: Mapping[str, str], address: str, port: int) -> dict[str, str]:
    """Horovod's run variables (gloo_run.create_run_env_vars): the rendezvous, the Gloo
    controller and operations, and on one machine the loopback interface for Gloo's pairs."""
    run = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    if env.get("MASTER_ADDR", "").startswith(LOOPBACK):
        run["HOROVOD_GLOO_IFACE"] = "lo"
    return run


def host_plan(slots: Mapping[str, str]) -> list[Any]:
    """Every rank's SlotInfo, which the rendezvous store sizes its scopes by (its DELETEs clear
    a scope once all of its ranks are connected)."""
    from horovod.runner.common.util.hosts import SlotInfo

    size, local_size = int(slots["HOROVOD_SIZE"]), int(slots["HOROVOD_LOCAL_SIZE"])
    nodes = size // local_size
    return [SlotInfo(hostname=f"node{r // local_size}", rank=r, local_rank=r % local_size,
                     cross_rank=r // local_size, size=size, local_size=local_size,
                     cross_size=nodes) for r in range(size)]  # fmt: skip


def serve_rendezvous(host: str, slots: Mapping[str, str]) -> int:
    """Serve Horovod's Gloo rendezvous store on ``host`` for this process's life; its port.
    Horovod's RendezvousServer.start binds every interface on a random port; this binds the
    agents' address, as torchrun's store does, with Horovod's own server and handler."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer((host, 0), RendezvousHandler, 0)
    server.init(host_plan(slots))
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True).start()
    return int(server.server_address[1])


def prepare(env: dict[str, str] | os._Environ[str]) -> None:
    """Set this worker's Horovod variables in ``env`` (os.environ), rank 0 serving the store."""
    from torch._C._distributed_c10d import TCPStore

    slots = slot_env(env)
    host = env["MASTER_ADDR"]
    store = TCPStore(host, int(env["MASTER_PORT"]), is_master=False, timeout=STORE_TIMEOUT)
    if slots["HOROVOD_RANK"] == "0":
        store.set(STORE_KEY, f"{host} {serve_rendezvous(host, slots)}")
    address, port = _current_rendezvous(store)
    env.update({**slots, **run_env(env, address, port)})


def _current_rendezvous(store: Any) -> tuple[str, int]:
    """This attempt's rendezvous address. The agents' store outlives attempts, and their restart
    counts may differ (an agent whose workers were healthy restarts them uncounted), so the key
    is one for all attempts: an address whose server does not answer is an earlier attempt's
    (its rank 0 was stopped before this attempt started), and is read again until rank 0 of
    this one has replaced it. Horovod's own store client gives up after 1.5 s."""
    deadline = time.monotonic() + STORE_TIMEOUT.total_seconds()
    while True:
        address, port = store.get(STORE_KEY).decode().split()
        try:
            socket.create_connection((address, int(port)), timeout=PROBE_TIMEOUT).close()
            return address, int(port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(PROBE_INTERVAL)
