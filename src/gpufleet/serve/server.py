"""``gpufleet serve``: a Triton model repository served by real Triton on this machine.

PyTriton (``nvidia-pytriton``) ships the Triton server with its Python backend; gpufleet binds
each model of the repository to it as a Python callable that runs the repository's TorchScript
(the official container runs the same file with its PyTorch backend). Clients speak the Open
Inference Protocol v2 over HTTP and gRPC; Triton's metrics endpoint is on.

Defaults that keep a laptop safe: every listener on 127.0.0.1; the model-repository (load,
unload), shared-memory, statistics, trace and logging APIs restricted behind a random access
token that nobody is told and that tritonserver's process list does not show (clients can infer
and read metadata and health, not change the server; gpufleet.serve.secret_argv); a request's
batch is at most the
model's ``max_batch_size`` and its shape must match the config (Triton checks before the model
runs). Triton 2.51, inside PyTriton 0.7, has no limit on the HTTP body size itself.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpufleet.errors import FieldError, UserInputError
from gpufleet.extras import missing
from gpufleet.net import free_port
from gpufleet.observe.http import url_host
from gpufleet.observe.tls import TlsFiles
from gpufleet.serve.guard import GuardServer, Limits, start_guard
from gpufleet.serve.repository import ModelEntry, read_repository
from gpufleet.serve.secret_argv import Shim, build_shim, secret_environment
from gpufleet.serve.torchscript import TorchScriptModel

# The APIs a client must not use (Triton's names): changing models, mapping shared memory,
# statistics, tracing and logging settings. (PyTriton's default too; stated so it stays so.)
RESTRICTED = ["model-repository", "shared-memory", "statistics", "trace", "logging"]


@dataclass(frozen=True)
class ServeConfig:
    """Where Triton listens."""

    address: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_file: Path | None = None
    # The largest HTTP request body, after decompression (None: from the models' configs,
    # gpufleet.serve.guard.default_max_body).
    max_request_bytes: int | None = None
    # HTTPS on the guard and TLS on Triton's gRPC (mutual with a client CA); None: plain.
    tls: TlsFiles | None = None


@dataclass(frozen=True)
class Endpoints:
    """Where a started server answers, and whether it still runs."""

    http: str
    grpc: str
    metrics: str
    models: list[ModelEntry]
    # False once tritonserver (or a model's backend) has died: `gpufleet serve` then exits
    # non-zero at once, so systemd or the kubelet restarts it, rather than living on portless.
    alive: Callable[[], bool] = field(default=lambda: True, repr=False, compare=False)
    # Triton's own HTTP listener behind the guard (127.0.0.1): for benchmarks of the guard.
    backend_http: str = ""
    # What the caller should tell the user (one line each), e.g. a token left visible.
    warnings: tuple[str, ...] = ()


# How long the models may take to report READY after Triton started.
READY_TIMEOUT_S = 120.0


def wait_models_ready(http: str, entries: list[ModelEntry], timeout: float) -> None:
    """Block until every model answers READY (GET /v2/models/<name>/ready is 200): the server
    is announced only then. Raises TimeoutError naming the models that never were."""
    pending = [e.name for e in entries]
    deadline = time.monotonic() + timeout
    while pending:
        for name in list(pending):
            try:
                with urllib.request.urlopen(f"{http}/v2/models/{name}/ready", timeout=5) as r:
                    if r.status == 200:
                        pending.remove(name)
            except OSError:  # 400 (not ready), refused, timed out: ask again
                pass
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"models not ready after {timeout:.0f} s: {', '.join(pending)}")
        if pending:
            time.sleep(0.2)


def _host(address: str) -> str:
    """``address`` as the host of a URL to reach it here: a wildcard address as loopback."""
    return url_host({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address))


def python_library_first(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this interpreter's LIBDIR first on LD_LIBRARY_PATH.

    PyTriton's Python backend stub is linked against a libpython; when the loader finds the
    system's instead of the running interpreter's (pyenv, conda, venvs of another Python), model
    load fails with "'_thread.RLock' object has no attribute '_recursion_count'". Putting the
    running interpreter's own library directory first makes the stub load the matching one.
    """
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and p != libdir]
    return {**env, "LD_LIBRARY_PATH": ":".join([libdir, *paths] if libdir else paths)}


def _infer_func(model: TorchScriptModel) -> Callable[..., Any]:
    from pytriton.decorators import batch

    if model.entry.batching.max_batch_size:

        def infer_batch(**inputs: Any) -> dict[str, Any]:
            return model(inputs)

        batched: Callable[..., Any] = batch(infer_batch)  # concatenates queued requests
        return batched

    def infer_each(requests: list[Any]) -> list[dict[str, Any]]:
        return [model(dict(request)) for request in requests]

    return infer_each


def _bind(triton: Any, entry: ModelEntry) -> None:
    import numpy as np
    import torch
    from pytriton.model_config import DynamicBatcher, ModelConfig
    from pytriton.model_config import Tensor as PTensor

    # A KIND_GPU model runs on the GPU when there is one, else on the CPU (a laptop).
    model = TorchScriptModel(
        entry, device="cuda" if entry.gpu and torch.cuda.is_available() else "cpu"
    )
    b = entry.batching
    batcher = (
        DynamicBatcher(
            max_queue_delay_microseconds=b.max_queue_delay_us,
            preferred_batch_size=list(b.preferred_batch_sizes) or None,
        )
        if b.dynamic and b.max_batch_size
        else None
    )
    triton.bind(
        model_name=entry.name,
        infer_func=[_infer_func(model) for _ in range(entry.instances)],
        inputs=[PTensor(name=t.name, dtype=np.dtype(t.dtype), shape=t.dims) for t in entry.inputs],
        outputs=[
            PTensor(name=t.name, dtype=np.dtype(t.dtype), shape=t.dims) for t in entry.outputs
        ],
        config=ModelConfig(
            batching=b.max_batch_size > 0, max_batch_size=max(b.max_batch_size, 1), batcher=batcher
        ),
        strict=True,
    )


def _restricted(triton_config: Any, token: str, shim: Shim | str) -> tuple[Any, Any]:
    """PyTriton's security settings and Triton's restricted-API flags for ``token``.

    With the shim, the flags carry its placeholder and PyTriton is given no endpoints to
    restrict (it would write the token itself into the flags); its clients still send the
    token. Without it, PyTriton writes the flags as it always does.
    """
    from pytriton.triton import TRITON_ACCESS_HEADER, TritonSecurityConfig

    if isinstance(shim, str):
        security = TritonSecurityConfig(access_token=token, restricted_endpoints=list(RESTRICTED))
        return security, triton_config
    flag = f"{','.join(RESTRICTED)}:{TRITON_ACCESS_HEADER}={shim.placeholder}"
    flags = replace(triton_config, http_restricted_api=flag, grpc_restricted_protocol=flag)
    return TritonSecurityConfig(access_token=token, restricted_endpoints=[]), flags


def _start(triton: Any, token: str, shim: Shim | str) -> None:
    """Start tritonserver with ``token`` in its environment, not its argv, where the shim was
    built; PyTriton's process logger dumps a child's whole environment at DEBUG, so it is held
    at INFO meanwhile."""
    if isinstance(shim, str):
        triton.run()
        return
    logger = logging.getLogger("pytriton.server.triton_server")
    level = logger.level
    logger.setLevel(max(level, logging.INFO))
    try:
        with secret_environment(shim, token):
            triton.run()
    finally:
        logger.setLevel(level)


def _grpc_tls(tls: TlsFiles | None) -> dict[str, Any]:
    """Triton's own gRPC TLS flags (--grpc-use-ssl and its certificates; mutual with a CA)."""
    if tls is None:
        return {}
    mutual = (
        {"grpc_use_ssl_mutual": True, "grpc_root_cert": Path(tls.client_ca)}
        if tls.client_ca
        else {}
    )
    return {"grpc_use_ssl": True, "grpc_server_cert": Path(tls.cert),
            "grpc_server_key": Path(tls.key), **mutual}  # fmt: skip


def _triton_config(
    triton_config: Any, config: ServeConfig, entries: list[ModelEntry], triton_http: int
) -> Any:
    """PyTriton's TritonConfig: gRPC and metrics where asked, HTTP private on loopback."""
    return triton_config(
        **_grpc_tls(config.tls),
        http_address="127.0.0.1",
        grpc_address=config.address,
        metrics_address=config.address,
        http_port=triton_http,
        grpc_port=config.grpc_port,
        metrics_port=config.metrics_port,
        strict_readiness=True,
        exit_on_error=True,
        allow_metrics=True,
        allow_gpu_metrics=any(e.gpu for e in entries),  # else Triton prints an NVML error
        log_file=config.log_file,
        exit_timeout_secs=5,
    )


@contextmanager
def serving(repository: Path, config: ServeConfig | None = None) -> Iterator[Endpoints]:
    """Serve every model of ``repository`` until the block ends."""
    config = config or ServeConfig()
    entries = read_repository(repository)
    try:
        from pytriton.triton import Triton, TritonConfig
    except ImportError as exc:
        raise missing("serve", "nvidia-pytriton", "serving") from exc
    os.environ.update(python_library_first(dict(os.environ)))  # the stub inherits it
    # Triton's HTTP is private; the guard (gpufleet.serve.guard) is the public HTTP endpoint.
    triton_http = free_port()
    triton_config = _triton_config(TritonConfig, config, entries, triton_http)
    # Our own workspace (model store, IPC sockets, the argv shim; mode 0700), removed below:
    # PyTriton's default is a TemporaryDirectory left to the garbage collector.
    home = Path(tempfile.mkdtemp(prefix="gpufleet-triton-"))
    token = secrets.token_urlsafe(32)  # fresh per start, never shown
    shim = build_shim(home)
    warnings = () if isinstance(shim, Shim) else (
        f"the Triton access token is visible in the process list ({shim}); a working C "
        "compiler (cc, or $CC) hides it",
    )  # fmt: skip
    security, triton_config = _restricted(triton_config, token, shim)
    triton = Triton(config=triton_config, workspace=home / "workspace", security_config=security)
    guard: GuardServer | None = None
    try:
        for entry in entries:
            _bind(triton, entry)
        _start(triton, token, shim)
        limits = Limits.for_models(entries, config.max_request_bytes)
        tls = config.tls.context() if config.tls else None
        try:
            guard, _ = start_guard(config.address, config.http_port, triton_http, limits,
                                   [e.name for e in entries], tls)  # fmt: skip
        except OSError as exc:
            where = f"{config.address}:{config.http_port}"
            message = f"cannot listen on {where}: {exc.strerror or exc}"
            raise UserInputError([FieldError("--http-port", message)]) from None
        scheme = "https" if tls else "http"
        http = f"{scheme}://{_host(config.address)}:{config.http_port}"
        backend = f"http://127.0.0.1:{triton_http}"
        wait_models_ready(backend, entries, READY_TIMEOUT_S)  # behind the guard: no certificate
        yield Endpoints(
            http=http,
            grpc=f"{_host(config.address)}:{config.grpc_port}",
            metrics=f"http://{_host(config.address)}:{config.metrics_port}/metrics",
            models=entries,
            alive=triton.is_alive,
            backend_http=backend,
            warnings=warnings,
        )
    finally:
        if guard is not None:
            guard.shutdown()
            guard.server_close()
        triton.stop()
        shutil.rmtree(home, ignore_errors=True)
