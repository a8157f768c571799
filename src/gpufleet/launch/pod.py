"""``python -m gpufleet.launch.pod [torchrun options] -m gpufleet.launch.shim ...``: a pod's
launcher. It is torchrun (``torch.distributed.run``, called in this process), plus what
``gpufleet run`` does around its agents locally:

- **Job metrics**: when ``GPUFLEET_METRICS_PORT`` is set (the renderers set it from
  ``spec.metrics.port``), it serves every local worker's metrics on that port for the pod's
  whole life, restarts included (address ``GPUFLEET_METRICS_ADDRESS``, default 127.0.0.1;
  the renderers set 0.0.0.0 so Prometheus can reach the pod).
- **Exit codes**: 0 done, 1 failed (after torchrun's restarts), 75 preempted (SIGTERM, and
  the workers confirmed a preemption checkpoint), 128+N another signal. Plain torchrun exits 1
  for all of these, and the Job's podFailurePolicy could not tell a preemption from a crash.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from gpufleet.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from gpufleet.runtime.context import ENV_METRICS_DIR, ENV_RUN_DIR, PREEMPTED_FILE

ENV_METRICS_PORT = "GPUFLEET_METRICS_PORT"
ENV_METRICS_ADDRESS = "GPUFLEET_METRICS_ADDRESS"
MODULE = "gpufleet.launch.pod"


def _metrics(env: dict[str, str]) -> AbstractContextManager[Any]:
    port = int(env.get(ENV_METRICS_PORT) or 0)
    directory = env.get(ENV_METRICS_DIR)
    if not port or not directory:
        return nullcontext()
    from gpufleet.launch.metrics_server import serve_metrics_dir

    return serve_metrics_dir(Path(directory), env.get(ENV_METRICS_ADDRESS, "127.0.0.1"), port)


def rendezvous_conf(conf: str, endpoint: str, hostname: str) -> str:
    """torchrun's ``--rdzv-conf`` with ``is_host`` set explicitly: true on the pod the endpoint
    names (its first DNS label is the pod's hostname: ``<job>-0`` of ``<job>-0.<job>:29400``),
    false elsewhere. Left unset, the c10d backend decides by resolving the endpoint at start-up,
    and the headless Service's record of a pod that just started may not exist yet: rank 0
    then waits as a client for a store nobody hosts. An explicit ``is_host`` is kept."""
    items = [c for c in conf.split(",") if c]
    if any(c.split("=", 1)[0].strip() == "is_host" for c in items):
        return conf
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
        return conf  # an address (a run on one machine): torch compares it without DNS
    except ValueError:
        pass
    if host == "localhost":
        return conf
    first = host.split(".", 1)[0]
    return ",".join([*items, f"is_host={'true' if first == hostname else 'false'}"])


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; return gpufleet's exit code for the outcome."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.rdzv_backend == "c10d" and args.rdzv_endpoint:
        import socket

        args.rdzv_conf = rendezvous_conf(args.rdzv_conf, args.rdzv_endpoint, socket.gethostname())
    run_dir = Path(os.environ.get(ENV_RUN_DIR, "."))
    (run_dir / PREEMPTED_FILE).unlink(missing_ok=True)
    with _metrics(dict(os.environ)):
        try:
            run(args)
        except ChildFailedError as exc:
            print(f"gpufleet: {exc}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        except SignalException as exc:
            if (run_dir / PREEMPTED_FILE).exists():
                print("gpufleet: preempted after a checkpoint", file=sys.stderr, flush=True)
                return EXIT_PREEMPTED
            return 128 + int(exc.sigval)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
