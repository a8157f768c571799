"""A fingerprint of model weights, to compare two runs bit for bit."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def state_digest(module: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer: name, dtype, shape and raw bytes, sorted by name.

    Equal digests mean bit-identical weights; DDP's ``module.`` prefix is ignored.
    """
    inner = getattr(module, "module", module)
    return digest_of(inner.state_dict())


def digest_of(state: Mapping[str, torch.Tensor]) -> str:
    """``state_digest`` of a plain state dict (name to tensor)."""
    h = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
