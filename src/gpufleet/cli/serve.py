"""``gpufleet export`` and ``gpufleet serve``: a trained model into Triton, and Triton here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import (
    TlsCertOption,
    TlsClientCaOption,
    TlsKeyOption,
    fail,
    stop_on_signals,
)
from gpufleet.console import err_console
from gpufleet.errors import FieldError, ServingError, UserInputError
from gpufleet.observe.tls import checked_context, cli_files
from gpufleet.serve.server import ServeConfig
from gpufleet.spec.inference import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_DELAY_US,
    DEFAULT_PREFERRED_BATCH_SIZES,
)

# The serve options' defaults are ServeConfig's (one home: 127.0.0.1, Triton's usual ports).
SERVE_DEFAULTS = ServeConfig()


def _ints(text: str, option: str, *, allow_empty: bool = False) -> tuple[int, ...]:
    """ "1,8,8" -> (1, 8, 8); exit 2 naming ``option`` otherwise."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        fail(UserInputError([FieldError(option, f"{text!r}: comma-separated integers")]))
    if not values and not allow_empty:
        fail(UserInputError([FieldError(option, "at least one integer")]))
    return values


def export_cmd(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="A checkpoint (a step directory, a checkpoint root or a run directory; local "
            "or an fsspec URI) or a TorchScript file."
        ),
    ],
    repository: Annotated[Path, typer.Option(help="The Triton model repository to write into.")],
    model: Annotated[
        str, typer.Option(help="The checkpoint's model: a built-in (digits) or module:function.")
    ] = "digits",
    name: Annotated[str | None, typer.Option(help="Model name (default: the model's).")] = None,
    input_shape: Annotated[
        str | None, typer.Option(help="Input shape without the batch dimension, e.g. 3,224,224.")
    ] = None,
    max_batch_size: Annotated[
        int, typer.Option(help="Largest batch (0: no batching).")
    ] = DEFAULT_MAX_BATCH_SIZE,
    preferred_batch_sizes: Annotated[
        str, typer.Option(help="Dynamic batching's preferred sizes (empty: no preference).")
    ] = ",".join(map(str, DEFAULT_PREFERRED_BATCH_SIZES)),
    max_queue_delay_us: Annotated[
        int, typer.Option(help="Longest a request waits for a batch to fill, microseconds.")
    ] = DEFAULT_MAX_QUEUE_DELAY_US,
    dynamic_batching: Annotated[bool, typer.Option(help="Merge requests into batches.")] = True,
    instances: Annotated[int, typer.Option(help="Model instances (instance_group count).")] = 1,
    gpu: Annotated[bool, typer.Option(help="instance_group kind GPU (default CPU).")] = False,
    service: Annotated[
        str | None,
        typer.Option(
            help="An InferenceService spec: take the model name, batching and GPU use from it "
            "(the repository then matches what the cluster serves)."
        ),
    ] = None,
) -> None:
    """Write a trained model into a Triton model repository (config.pbtxt, 1/model.pt)."""
    from gpufleet.serve.export import export
    from gpufleet.serve.repository import Batching, describe

    batching = Batching(
        max_batch_size=max_batch_size,
        dynamic=dynamic_batching,
        preferred_batch_sizes=_ints(
            preferred_batch_sizes, "--preferred-batch-sizes", allow_empty=True
        ),
        max_queue_delay_us=max_queue_delay_us,
    )
    if service is not None:
        from gpufleet.cli.common import load_any
        from gpufleet.spec import InferenceService

        svc = load_any(service, None)
        if not isinstance(svc, InferenceService):
            fail(UserInputError([FieldError("--service", "expected an InferenceService")], service))
        batching = Batching.of_service(svc.spec.batching)
        name, gpu = svc.spec.model.name, svc.spec.resources.gpu > 0
    dims = _ints(input_shape, "--input-shape") if input_shape else None
    try:
        entry, what = export(
            checkpoint,
            repository,
            model=model,
            name=name,
            batching=batching,
            instances=instances,
            gpu=gpu,
            input_dims=dims,
        )
    except UserInputError as exc:
        fail(exc)
    err_console.print(f"exported {what}\n  -> {entry.directory} ({describe(entry)})")


def serve(
    repository: Annotated[Path, typer.Option(help="The Triton model repository to serve.")],
    address: Annotated[
        str, typer.Option(help="Listen address; 0.0.0.0 to be reachable from other hosts.")
    ] = SERVE_DEFAULTS.address,
    http_port: Annotated[
        int, typer.Option(help="Open Inference Protocol over HTTP.")
    ] = SERVE_DEFAULTS.http_port,
    grpc_port: Annotated[
        int, typer.Option(help="Open Inference Protocol over gRPC.")
    ] = SERVE_DEFAULTS.grpc_port,
    metrics_port: Annotated[
        int, typer.Option(help="Triton's Prometheus metrics.")
    ] = SERVE_DEFAULTS.metrics_port,
    log_file: Annotated[
        Path | None, typer.Option(help="Triton's own log (default: a file beside the repository).")
    ] = None,
    max_request_bytes: Annotated[
        int | None,
        typer.Option(
            help="Largest HTTP request body, after gzip/deflate too (default: what the models' "
            "largest batch takes as JSON, at least 1 MiB; 64 MiB with variable dims)."
        ),
    ] = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
) -> None:
    """Serve a model repository with Triton (PyTriton) until SIGTERM or Ctrl-C."""
    from gpufleet.serve.repository import describe
    from gpufleet.serve.server import serving

    bad = [
        (o, p)
        for o, p in (
            ("--http-port", http_port),
            ("--grpc-port", grpc_port),
            ("--metrics-port", metrics_port),
        )
        if not 0 < p < 65536
    ]
    if bad:
        fail(UserInputError([FieldError(o, f"{p}: a port from 1 to 65535") for o, p in bad]))
    if max_request_bytes is not None and max_request_bytes < 1024:
        message = f"must be at least 1024, got {max_request_bytes}"
        fail(UserInputError([FieldError("--max-request-bytes", message)]))
    try:
        tls = cli_files(tls_cert, tls_key, tls_client_ca)
        if tls is not None:
            checked_context(tls)  # a bad certificate fails before Triton starts
    except UserInputError as exc:
        fail(exc)
    log = log_file or repository.resolve().parent / f"{repository.name}.triton.log"
    config = ServeConfig(
        address=address,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_file=log,
        max_request_bytes=max_request_bytes,
        tls=tls,
    )
    stop = stop_on_signals()
    try:
        with serving(repository, config) as endpoints:
            for warning in endpoints.warnings:
                err_console.print(f"warning: {warning}")
            for entry in endpoints.models:
                err_console.print(f"model {describe(entry)}")
            err_console.print(
                f"serving: HTTP {endpoints.http}  gRPC {endpoints.grpc}  metrics "
                f"{endpoints.metrics}  (Triton log: {log})"
            )
            while not stop.wait(0.5):
                if not endpoints.alive():
                    fail(ServingError(f"Triton exited unexpectedly; {_log_tail(log)}"))
            err_console.print("stopping")
    except TimeoutError as exc:
        fail(ServingError(f"{exc}; {_log_tail(log)}"))
    except UserInputError as exc:
        fail(exc)


def _log_tail(log: Path, lines: int = 3) -> str:
    """``its log ends: ...`` (the last lines of Triton's log, one line), or where the log is."""
    try:
        tail = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        tail = []
    if not tail:
        return f"nothing in its log {log}"
    return f"its log {log} ends: {' | '.join(tail[-lines:])}"
