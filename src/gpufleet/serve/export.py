"""``gpufleet export``: a trained model -> a Triton model repository.

Sources: a gpufleet checkpoint (a step directory, a checkpoint root, or a run directory; local
or an fsspec URI) loaded into a built-in model (``digits``) or a user's ``module:factory``, or a
TorchScript file. Output shapes and dtypes come from running the model once on zeros.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import FieldError, UserInputError
from gpufleet.runtime.context import CHECKPOINTS_DIR
from gpufleet.serve.repository import DTYPES, Batching, ModelEntry, Tensor, write_model

if TYPE_CHECKING:  # the runtime imports torch: only when a checkpoint is read
    from gpufleet.runtime.checkpoint import Checkpointer, CheckpointRef


def _digits() -> Any:
    from gpufleet.workloads.digits import DigitsCNN

    return DigitsCNN()


# Built-in models: factory and input tensors (without the batch dimension).
BUILTIN: dict[str, tuple[Callable[[], Any], list[Tensor]]] = {
    "digits": (_digits, [Tensor("INPUT__0", "float32", (1, 8, 8))]),
}


def _factory(model: str) -> tuple[Callable[[], Any], list[Tensor] | None]:
    if model in BUILTIN:
        factory, inputs = BUILTIN[model]
        return factory, inputs
    module_name, sep, attr = model.partition(":")
    if not sep:
        raise UserInputError(
            [
                FieldError(
                    "--model",
                    f"{model!r}: a built-in model ({', '.join(BUILTIN)}) or module:function",
                )
            ]
        )
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserInputError([FieldError("--model", f"cannot import {model}: {exc}")]) from exc
    return fn, None


def resolve_checkpoint(source: str) -> tuple[Checkpointer, CheckpointRef]:
    """The newest complete checkpoint that ``source`` names, and a Checkpointer to load it."""
    import fsspec

    from gpufleet.errors import CheckpointError
    from gpufleet.runtime import integrity
    from gpufleet.runtime.checkpoint import Checkpointer, CheckpointRef

    local = "://" not in source or source.startswith("file://")
    path = Path(source.removeprefix("file://"))
    if local:
        if not path.exists():
            raise UserInputError([FieldError("CHECKPOINT", f"{source}: no such file or directory")])
        if (path / integrity.MARKER).is_file():  # one step directory: checked, never set aside
            fs = fsspec.filesystem("file")
            marker = integrity.read_marker(fs, str(path))
            problems = integrity.verify(fs, str(path), marker)
            if problems:
                raise UserInputError([FieldError("CHECKPOINT", (
                    f"{source} is corrupt ({'; '.join(map(str, problems))}); export an older "
                    "checkpoint (`gpufleet checkpoints verify` lists them)"))])  # fmt: skip
            step = int(marker.get("step", 0))
            return Checkpointer(str(path.parent)), CheckpointRef(step, str(path))
        if (path / CHECKPOINTS_DIR).is_dir():  # a run directory
            path = path / CHECKPOINTS_DIR
        source = str(path)
    checkpointer = Checkpointer(source)  # warns on stderr when it sets a corrupt one aside
    try:
        ref = checkpointer.latest()
    except CheckpointError as exc:
        raise UserInputError([FieldError("CHECKPOINT", str(exc))]) from exc
    if ref is None:
        raise UserInputError([FieldError("CHECKPOINT", f"{source}: no complete checkpoint in it")])
    return checkpointer, ref


def load_model(
    source: str, model: str, input_dims: tuple[int, ...] | None, input_dtype: str = "float32"
) -> tuple[Any, list[Tensor], str]:
    """(module in eval mode, its input tensors, what was loaded) for ``source``."""
    import torch

    if Path(source).is_file():  # TorchScript
        if not input_dims:
            raise UserInputError([FieldError("--input-shape", "required for a TorchScript file")])
        try:
            module: Any = torch.jit.load(source, map_location="cpu")  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise UserInputError([FieldError("CHECKPOINT", f"not TorchScript: {exc}")]) from exc
        return module.eval(), [Tensor("INPUT__0", input_dtype, input_dims)], f"TorchScript {source}"
    factory, inputs = _factory(model)
    if input_dims:
        inputs = [Tensor("INPUT__0", input_dtype, input_dims)]
    if not inputs:
        raise UserInputError([FieldError("--input-shape", f"required for --model {model}")])
    checkpointer, ref = resolve_checkpoint(source)
    try:
        module = factory()
        state = module.state_dict()
    except Exception as exc:  # the user's factory: report it as their input
        raise UserInputError(
            [FieldError("--model", f"{model}(): {type(exc).__name__}: {exc}")]
        ) from exc
    path = ref.path
    try:  # the Trainer saves {"job": {"model": ..., "optim": ..., ...}}; read the model only
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            checkpointer.load(ref, {"job": {"model": state}})
    except Exception as exc:
        raise UserInputError(
            [
                FieldError(
                    "--model",
                    f"checkpoint {path} does not hold a {model} model: {type(exc).__name__}: {exc}",
                )
            ]
        ) from exc
    module.load_state_dict(state)
    return module.eval(), inputs, f"{model} from checkpoint {path} (step {ref.step})"


def output_tensors(module: Any, inputs: list[Tensor], batched: bool) -> list[Tensor]:
    """The outputs' names, dtypes and shapes, from one forward pass on zeros."""
    import torch

    from gpufleet.serve.torchscript import torch_dtype

    args = [
        torch.zeros(
            ((2,) if batched else ()) + tuple(max(d, 1) for d in t.dims), dtype=torch_dtype(t.dtype)
        )
        for t in inputs
    ]
    with torch.no_grad():
        out = module(*args)
    outs = out if isinstance(out, tuple | list) else (out,)
    tensors = []
    for i, o in enumerate(outs):
        dtype = str(o.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise UserInputError([FieldError(f"output[{i}]", f"unsupported dtype {dtype}")])
        tensors.append(Tensor(f"OUTPUT__{i}", dtype, tuple(o.shape[1:] if batched else o.shape)))
    return tensors


def export(
    source: str,
    repository: Path,
    *,
    model: str = "digits",
    name: str | None = None,
    batching: Batching | None = None,
    instances: int = 1,
    gpu: bool = False,
    input_dims: tuple[int, ...] | None = None,
) -> tuple[ModelEntry, str]:
    """Write ``source`` into ``repository``; returns the entry and what was loaded."""
    batching = batching or Batching()
    module, inputs, what = load_model(source, model, input_dims)
    outputs = output_tensors(module, inputs, batching.max_batch_size > 0)
    model_name = name or (model if model in BUILTIN else "model")
    entry = ModelEntry(
        name=model_name,
        directory=repository / model_name,
        inputs=inputs,
        outputs=outputs,
        batching=batching,
        instances=instances,
        gpu=gpu,
    )
    write_model(module, entry)
    return entry, what
