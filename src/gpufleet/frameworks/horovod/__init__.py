"""Horovod workers (spec.framework horovod): a user's unmodified Horovod PyTorch script, started
by torchrun's elastic agent as every worker is, over Horovod's Gloo controller.

What ``horovodrun --gloo`` gives each process, gpufleet gives it from torchrun's environment:
the HOROVOD_* slot variables (rank, size, local and cross ranks) and the address of Horovod's
Gloo rendezvous, an HTTP store (Horovod's own RendezvousHTTPServer) that rank 0 serves for the
group's attempt and publishes in the agents' store. A crashed rank makes the agents restart the
whole group (spec.maxRestarts); each attempt gets a new rendezvous server, and the script
resumes from its own checkpoint. Importing this package imports neither torch nor Horovod.
Under mpirun (the mpijob target) Horovod's MPI controller is used and none of this is.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import urllib.request
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = [
    "HOROVOD_ENV",
    "LOOPBACK",
    "STORE_KEY",
    "STORE_TIMEOUT",
    "SlotError",
    "current_rendezvous",
    "host_name",
    "host_plan",
    "prepare",
    "run_env",
    "serve_rendezvous",
    "slot_env",
]

# What every rank of a Horovod job gets, here and in pods (spec.env may set otherwise): no tensor
# fusion. Fused, tensors are batched by when they are ready, so with 3 ranks or more the order
# of a sum changes from run to run (two 4-rank runs here ended with other weights; unfused, the
# same, bit for bit), and a resume could not end with the uninterrupted run's weights.
HOROVOD_ENV = {"HOROVOD_FUSION_THRESHOLD": "0"}

# The key of the rendezvous address in the agents' store (the worker group's store, which
# torchrun names in MASTER_ADDR and MASTER_PORT), and how long a rank waits for rank 0's.
STORE_KEY = "gpufleet/horovod/rendezvous"
STORE_TIMEOUT = timedelta(minutes=5)  # as long as a rank may take to start, torch imported
# Where rank 0's server holds the nonce it published with its address (a scope of its store
# that Horovod's Gloo never uses), and how long a rank waits for that server's answer.
NONCE_SCOPE, NONCE_KEY = "gpufleet", "nonce"
PROBE_TIMEOUT, PROBE_INTERVAL = 2.0, 0.2  # seconds
LOOPBACK = ("127.", "localhost", "::1")


class SlotError(ValueError):
    """torchrun's environment lacks what Horovod's slot variables are made of."""


def slot_env(env: Mapping[str, str]) -> dict[str, str]:
    """This worker's HOROVOD_* slot variables, as Horovod's gloo_run.create_slot_env_vars sets
    them, from torchrun's: ranks are torchrun's (node-major, as Horovod assigns them), the
    "host" is the node (its group rank), and a node's workers share it."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise SlotError("needs torchrun's shared store for its rendezvous address "
                        "(TORCHELASTIC_USE_AGENT_STORE is not True: unset "
                        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE)")  # fmt: skip
    try:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank, local_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        node = int(env["GROUP_RANK"])
    except (KeyError, ValueError) as exc:
        missing = f"not started by torchrun's agent: {exc} is missing or not a number"
        raise SlotError(missing) from None
    return {
        "HOROVOD_HOSTNAME": host_name(node),
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(node),
        "HOROVOD_CROSS_SIZE": str(size // local_size),
    }


def host_name(node: int) -> str:
    """The "host" of a node's ranks in Horovod's eyes: its scope of local ranks."""
    return f"node{node}"


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
    return [SlotInfo(hostname=host_name(r // local_size), rank=r, local_rank=r % local_size,
                     cross_rank=r // local_size, size=size, local_size=local_size,
                     cross_size=nodes) for r in range(size)]  # fmt: skip


def serve_rendezvous(host: str, slots: Mapping[str, str], nonce: str) -> Any:
    """Serve Horovod's Gloo rendezvous store on ``host`` for this process's life, holding
    ``nonce``; the server (its port: ``server_address[1]``). Horovod's RendezvousServer.start
    binds every interface on a random port; this binds the agents' address, as torchrun's store
    does, with Horovod's own server and handler."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer((host, 0), RendezvousHandler, 0)
    server.init(host_plan(slots))
    with server.cache_lock:
        server.cache[NONCE_SCOPE] = {NONCE_KEY: nonce.encode()}
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True).start()
    return server


def prepare(env: dict[str, str] | os._Environ[str]) -> None:
    """Set this worker's Horovod variables in ``env`` (os.environ), rank 0 serving the store."""
    slots = slot_env(env)  # before torch's import: a bad environment is one line at once
    from torch._C._distributed_c10d import TCPStore

    host = env["MASTER_ADDR"]
    store = TCPStore(host, int(env["MASTER_PORT"]), is_master=False, timeout=STORE_TIMEOUT)
    if slots["HOROVOD_RANK"] == "0":
        nonce = secrets.token_hex(8)
        port = serve_rendezvous(host, slots, nonce).server_address[1]
        store.set(STORE_KEY, f"{host} {port} {nonce}")
    address, port = current_rendezvous(store)
    env.update({**slots, **run_env(env, address, port)})


def current_rendezvous(store: Store) -> tuple[str, int]:
    """This attempt's rendezvous address. The agents' store outlives attempts, and their restart
    counts may differ (an agent whose workers were healthy restarts them uncounted), so the key
    is one for all attempts: an address whose server does not give back the nonce published
    with it is an earlier attempt's (its rank 0 was stopped before this attempt started; its
    port may be another server's since), and is read again until rank 0 of this one has
    replaced it. Horovod's own store client would give up on a dead one after 1.5 s."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as Horovod's own
    deadline = time.monotonic() + STORE_TIMEOUT.total_seconds()
    while True:
        address, port, nonce = store.get(STORE_KEY).decode().split()
        url = f"http://{address}:{port}/{NONCE_SCOPE}/{NONCE_KEY}"
        try:
            with direct.open(url, timeout=PROBE_TIMEOUT) as answer:
                if answer.read().decode() == nonce:
                    return address, int(port)
        except OSError:  # refused, timed out, or not found there (urllib's HTTPError)
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no rendezvous answered at {address}:{port} in "
                               f"{STORE_TIMEOUT.total_seconds():.0f} s")  # fmt: skip
        time.sleep(PROBE_INTERVAL)
