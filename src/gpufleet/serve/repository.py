"""Triton model repositories: write one from a trained model, read one back.

Layout (what the official Triton container serves with its PyTorch backend)::

    <repository>/<model>/config.pbtxt     ModelConfig in protobuf text format
    <repository>/<model>/1/model.pt       TorchScript

The config is built and parsed with Triton's own ``model_config.proto`` (shipped in
tritonclient as ``tritonclient.grpc.model_config_pb2``) and protobuf's text format, so what
gpufleet writes is what Triton reads. Tensors follow the PyTorch backend's naming convention
(``INPUT__0``, ``OUTPUT__0``): TorchScript keeps no tensor names of its own.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import FieldError, UserInputError
from gpufleet.extras import missing
from gpufleet.spec.inference import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_DELAY_US,
    DEFAULT_PREFERRED_BATCH_SIZES,
    MODEL_NAME,
    ServingBatching,
    preferred_out_of_range,
)

CONFIG_FILE = "config.pbtxt"
MODEL_FILE = "model.pt"
VERSION = "1"
# numpy dtype name <-> Triton data type (the ones a TorchScript model can take or give).
DTYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "float64": "TYPE_FP64",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "int16": "TYPE_INT16",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}


def model_config_pb2() -> Any:
    """Triton's ModelConfig protobuf module (tritonclient[grpc]); exit 2 with a hint if absent."""
    try:
        return importlib.import_module("tritonclient.grpc.model_config_pb2")
    except ImportError as exc:
        raise missing("serve", "tritonclient", "serving") from exc


@dataclass(frozen=True)
class Tensor:
    """One input or output: its name, numpy dtype name and shape without the batch dimension."""

    name: str
    dtype: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Batching:
    """Triton's batching settings: ``max_batch_size`` 0 means the model takes no batch
    dimension; dynamic batching merges requests up to the preferred sizes, waiting at most
    ``max_queue_delay_us`` for more."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    dynamic: bool = True
    preferred_batch_sizes: tuple[int, ...] = DEFAULT_PREFERRED_BATCH_SIZES
    max_queue_delay_us: int = DEFAULT_MAX_QUEUE_DELAY_US

    @classmethod
    def of_service(cls, b: ServingBatching) -> Batching:
        """An InferenceService's batching, as `gpufleet export --service` writes it."""
        return cls(
            max_batch_size=b.max_batch_size,
            dynamic=b.max_batch_size > 0,
            preferred_batch_sizes=tuple(b.preferred_batch_sizes),
            max_queue_delay_us=round(b.max_queue_delay * 1e6),
        )


@dataclass(frozen=True)
class ModelEntry:
    """A model of a repository as gpufleet serves it."""

    name: str
    directory: Path
    inputs: list[Tensor]
    outputs: list[Tensor]
    batching: Batching
    instances: int = 1
    gpu: bool = False
    config: Any = field(default=None, compare=False, repr=False)

    @property
    def model_file(self) -> Path:
        return self.directory / VERSION / MODEL_FILE


def config_text(entry: ModelEntry) -> str:
    """config.pbtxt for ``entry`` (Triton's ModelConfig, protobuf text format)."""
    from google.protobuf import text_format

    m = model_config_pb2()
    config = m.ModelConfig(
        name=entry.name, backend="pytorch", max_batch_size=entry.batching.max_batch_size
    )
    for tensors, add in ((entry.inputs, config.input.add), (entry.outputs, config.output.add)):
        for t in tensors:
            add(name=t.name, data_type=m.DataType.Value(DTYPES[t.dtype]), dims=list(t.dims))
    kind = m.ModelInstanceGroup.KIND_GPU if entry.gpu else m.ModelInstanceGroup.KIND_CPU
    config.instance_group.add(count=entry.instances, kind=kind)
    b = entry.batching
    if b.dynamic and b.max_batch_size:
        config.dynamic_batching.preferred_batch_size.extend(b.preferred_batch_sizes)
        config.dynamic_batching.max_queue_delay_microseconds = b.max_queue_delay_us
    text: str = text_format.MessageToString(config)
    return text


def check_entry(entry: ModelEntry, where: str = "") -> list[FieldError]:
    """What is wrong with ``entry`` (empty: nothing), with field paths under ``where``."""
    p = f"{where}." if where else ""
    errors = []
    if not MODEL_NAME.match(entry.name):
        errors.append(FieldError(f"{p}name", "1-63 letters, digits, '_', '.' or '-'"))
    b = entry.batching
    if b.max_batch_size < 0:
        errors.append(FieldError(f"{p}max_batch_size", "must be 0 (no batching) or more"))
    bad = preferred_out_of_range(b.preferred_batch_sizes, b.max_batch_size)
    if b.dynamic and b.max_batch_size and bad:
        errors.append(
            FieldError(
                f"{p}dynamic_batching.preferred_batch_size",
                f"{bad} not within 1..max_batch_size ({b.max_batch_size})",
            )
        )
    if b.max_queue_delay_us < 0:
        errors.append(FieldError(f"{p}dynamic_batching.max_queue_delay_microseconds", ">= 0"))
    if entry.instances < 1:
        errors.append(FieldError(f"{p}instance_group[0].count", "must be at least 1"))
    for kind, tensors in (("input", entry.inputs), ("output", entry.outputs)):
        if not tensors:
            errors.append(FieldError(f"{p}{kind}", "at least one tensor"))
        for i, t in enumerate(tensors):
            if t.dtype not in DTYPES:
                errors.append(FieldError(f"{p}{kind}[{i}].data_type", f"unsupported {t.dtype}"))
            if any(d == 0 or d < -1 for d in t.dims):
                errors.append(FieldError(f"{p}{kind}[{i}].dims", f"{list(t.dims)}: >0 or -1"))
    return errors


def write_model(module: Any, entry: ModelEntry) -> None:
    """Save ``module`` (TorchScript, or scriptable) and its config into ``entry.directory``.
    Raises UserInputError for a bad entry or a module TorchScript rejects."""
    import torch

    errors = check_entry(entry)
    if errors:
        raise UserInputError(errors)
    if isinstance(module, torch.jit.ScriptModule):
        scripted = module
    else:
        module.eval()
        try:
            scripted = torch.jit.script(module)
        except Exception as exc:  # TorchScript's own message names the construct
            raise UserInputError([FieldError("model", f"not TorchScript-able: {exc}")]) from exc
    entry.model_file.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(scripted, str(entry.model_file))
    (entry.directory / CONFIG_FILE).write_text(config_text(entry))


def read_repository(repository: Path) -> list[ModelEntry]:
    """Every model of ``repository``; UserInputError naming each bad file and field."""
    from google.protobuf import text_format

    m = model_config_pb2()
    try:
        if not repository.is_dir():
            raise UserInputError([FieldError("--repository", f"{repository}: not a directory")])
        directories = sorted(p for p in repository.iterdir() if p.is_dir())
    except PermissionError as exc:  # a volume this user may not read (a pod's UID, say)
        message = f"{repository}: not readable by UID {os.getuid()} ({exc.strerror})"
        raise UserInputError([FieldError("--repository", message)]) from None
    entries, errors = [], []
    for directory in directories:
        where = f"{directory.name}/{CONFIG_FILE}"
        config = m.ModelConfig()
        try:
            text_format.Parse((directory / CONFIG_FILE).read_text(), config)
        except FileNotFoundError:
            errors.append(FieldError(where, "missing"))
            continue
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            errors.append(FieldError(where, f"not a Triton model config: {exc}"))
            continue
        entry = _entry_of(config, directory, m)
        if isinstance(entry, FieldError):
            errors.append(FieldError(f"{where}: {entry.path}", entry.message))
            continue
        errors += [FieldError(f"{where}: {e.path}", e.message) for e in check_entry(entry)]
        if config.name and config.name != directory.name:
            errors.append(
                FieldError(
                    f"{where}: name",
                    f"{config.name!r} differs from the directory {directory.name!r}",
                )
            )
        if not entry.model_file.is_file():
            errors.append(FieldError(where, f"no {VERSION}/{MODEL_FILE} beside it"))
        entries.append(entry)
    if errors:
        raise UserInputError(errors)
    if not entries:
        raise UserInputError([FieldError("--repository", f"{repository}: no models in it")])
    return entries


def _entry_of(config: Any, directory: Path, m: Any) -> ModelEntry | FieldError:
    names = {v: k for k, v in DTYPES.items()}

    def tensors(items: Any) -> list[Tensor]:
        out = []
        for t in items:
            dtype = names.get(m.DataType.Name(t.data_type), m.DataType.Name(t.data_type))
            out.append(Tensor(t.name, dtype, tuple(t.dims)))
        return out

    if config.backend not in ("", "pytorch") or config.platform not in ("", "pytorch_libtorch"):
        return FieldError(
            "backend",
            f"{config.backend or config.platform}: gpufleet serves "
            "TorchScript models (backend pytorch)",
        )
    groups = list(config.instance_group)
    dyn = config.HasField("dynamic_batching")
    return ModelEntry(
        name=config.name or directory.name,
        directory=directory,
        inputs=tensors(config.input),
        outputs=tensors(config.output),
        batching=Batching(
            max_batch_size=config.max_batch_size,
            dynamic=dyn,
            preferred_batch_sizes=tuple(config.dynamic_batching.preferred_batch_size),
            max_queue_delay_us=config.dynamic_batching.max_queue_delay_microseconds,
        ),
        instances=sum(g.count or 1 for g in groups) or 1,
        gpu=any(g.kind == m.ModelInstanceGroup.KIND_GPU for g in groups),
        config=config,
    )


def describe(entry: ModelEntry) -> str:
    """One line for logs: name, tensors, batching."""
    io = json.dumps({t.name: [t.dtype, *t.dims] for t in entry.inputs + entry.outputs})
    b = entry.batching
    batching = (
        f"dynamic batching {list(b.preferred_batch_sizes)} <= {b.max_queue_delay_us} us"
        if b.dynamic
        else "no dynamic batching"
    )
    return f"{entry.name}: {io}, max batch {b.max_batch_size}, {batching}"
