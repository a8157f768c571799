"""Requests to an Open Inference Protocol v2 (KServe/Triton) HTTP endpoint, for the serving tests
and the inference benchmark: well-formed ones, and the hostile ones with Triton's answers."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import numpy as np

MODEL = "digits"

# Triton 2.51 (PyTriton 0.7) answers 500, not 400, for every request body its JSON request
# parser rejects. These are that family's messages, as seen for 1,500 fuzzed bodies and the
# hostile table (not JSON; a member of the Open Inference Protocol request missing or of the
# wrong type: no 'inputs', no 'datatype', data of the wrong type or count, a negative dim;
# BYTES data that is not strings); docs/serving.md lists them. Any other 500 is a failure of
# the server or the model.
PARSE_ERRORS_500 = re.compile(
    r"failed to parse the request JSON buffer"
    r"|Unable to parse '(inputs|outputs|name|shape|datatype|data|parameters)'"
    r"|Unable to parse JSON bytes array"
)


def is_parse_error(answer: dict[str, Any]) -> bool:
    """Whether an error answer is one of Triton's documented request-parsing 500s."""
    return PARSE_ERRORS_500.match(str(answer.get("error", ""))) is not None


def ready(base: str) -> bool:
    """Whether the server answers 200 on /v2/health/ready."""
    try:
        with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=10) as resp:
            return resp.status == 200
    except OSError:
        return False


def post(
    base: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """POST ``body`` to ``base`` + ``path``: the status and the JSON answer (or its text)."""
    req = urllib.request.Request(
        f"{base}{path}",
        data=body,
        method="POST",
        headers=headers or {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        with err:
            text = err.read()
        try:
            return err.code, json.loads(text)
        except json.JSONDecodeError:
            return err.code, {"error": text.decode(errors="replace")}


def infer_body(shape: list[int], datatype: str = "FP32", n: int | None = None) -> bytes:
    """An infer request for INPUT__0 of ``shape`` (``n`` data elements, default: the shape's)."""
    count = int(np.prod(shape)) if n is None else n
    value: Any = 0 if datatype.startswith("INT") else 0.5
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT__0", "shape": shape, "datatype": datatype, "data": [value] * count}
            ]
        }
    ).encode()


INFER = f"/v2/models/{MODEL}/infer"
# What `gpufleet serve` answers: its guard (gpufleet.serve.guard) for bodies and shapes out of
# bounds, Triton 2.51 (in PyTriton 0.7) for the rest; docs/serving.md records the same table.
HOSTILE: list[tuple[str, str, bytes, int]] = [
    ("malformed JSON", INFER, b'{"inputs": [', 500),
    ("not an object", INFER, b"[1, 2, 3]", 500),
    ("unknown model", "/v2/models/nope/infer", infer_body([1, 1, 8, 8]), 404),
    ("wrong shape", INFER, infer_body([1, 1, 8, 7]), 400),
    ("wrong dtype", INFER, infer_body([1, 1, 8, 8], "INT32"), 400),
    ("data count differs from shape", INFER, infer_body([1, 1, 8, 8], n=10), 500),
    ("batch over max_batch_size", INFER, infer_body([65, 1, 8, 8]), 400),
    ("huge batch (a body above the guard's bound)", INFER, infer_body([4096, 1, 8, 8]), 413),
    # The request that killed tritonserver: one element, a shape of 2**42 * 512 elements.
    ("shape bomb", INFER, infer_body([64, 1, 8, 1099511627776], n=1), 400),
    ("shape of zero elements, huge dim", INFER, infer_body([0, 1, 8, 1099511627776], n=0), 400),
    ("shape claims more than the body holds", INFER, infer_body([64, 1, 8, 8], n=1), 400),
    ("negative dim", INFER, infer_body([1, 1, -8, 8], n=1), 400),
    (
        "unknown input name",
        INFER,
        json.dumps(
            {
                "inputs": [
                    {"name": "X", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.0] * 64}
                ]
            }
        ).encode(),
        400,
    ),
    (
        "oversized body (64 MB)",
        INFER,
        b'{"inputs": [{"name": "INPUT__0", "data": [' + b"0," * (32 << 20) + b"0]}]}",
        413,
    ),
]
