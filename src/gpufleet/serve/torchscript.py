"""Running a repository's TorchScript model on batches, as Triton's PyTorch backend would."""

from __future__ import annotations

from typing import Any

from gpufleet.serve.repository import ModelEntry


def torch_dtype(name: str) -> Any:
    """The torch dtype of a numpy dtype name ("float32" -> torch.float32)."""
    import torch

    return getattr(torch, name)


class TorchScriptModel:
    """``entry``'s model.pt on ``device``: called with {input name: array of a batch}, returns
    {output name: array}. Thread-safe for inference (TorchScript modules are)."""

    def __init__(self, entry: ModelEntry, device: str = "cpu") -> None:
        import torch

        self.entry = entry
        self.device = device
        loaded: Any = torch.jit.load(str(entry.model_file), map_location=device)  # type: ignore[no-untyped-call]
        self.module = loaded.eval()
        self._dtypes = [torch_dtype(t.dtype) for t in entry.inputs]

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch

        args = [
            torch.as_tensor(inputs[t.name]).to(self.device, dtype)
            for t, dtype in zip(self.entry.inputs, self._dtypes, strict=True)
        ]
        with torch.inference_mode():
            out = self.module(*args)
        outs = out if isinstance(out, tuple | list) else (out,)
        return {t.name: o.cpu().numpy() for t, o in zip(self.entry.outputs, outs, strict=True)}
