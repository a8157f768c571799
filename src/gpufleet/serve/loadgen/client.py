"""The system under test's client side: an Open Inference Protocol v2 endpoint through
NVIDIA's tritonclient, and random query samples shaped like the model's inputs."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import FieldError, UserInputError
from gpufleet.extras import missing

# Triton datatype -> numpy dtype name
NUMPY = {
    "FP32": "float32",
    "FP16": "float16",
    "FP64": "float64",
    "INT64": "int64",
    "INT32": "int32",
    "INT16": "int16",
    "INT8": "int8",
    "UINT8": "uint8",
    "BOOL": "bool",
}


@dataclass(frozen=True)
class ClientTls:
    """TLS to the server: the CA that signed its certificate, and for mutual TLS this client's
    certificate and key (PEM files)."""

    ca: str
    cert: str | None = None
    key: str | None = None


class Target:
    """An Open Inference Protocol v2 endpoint through tritonclient: gRPC for ``host:port`` or
    ``grpc://``, HTTP for ``http://`` (``https://``); with ``tls``, over TLS either way."""

    def __init__(
        self, url: str, model: str, concurrency: int, tls: ClientTls | None = None
    ) -> None:
        self.http = url.startswith(("http://", "https://"))
        self.url = url
        self.model = model
        self.concurrency = max(concurrency, 1)
        self.tls = tls
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._clients: list[Any] = []
        self._clients_lock = threading.Lock()
        self.address = re.sub(r"^(grpc|https?)://", "", url).rstrip("/")
        try:
            if self.http:
                import tritonclient.http as client
            else:
                import tritonclient.grpc as client
        except ImportError as exc:
            raise missing("serve", "tritonclient") from exc
        self.lib: Any = client
        self.client: Any = self._new_client(concurrency)
        try:
            meta = self.client.get_model_metadata(model)
            config = self.client.get_model_config(model)
        except Exception as exc:  # unreachable, unknown model: the server's own words
            self.close()
            raise UserInputError([FieldError("--url/--model", f"{url} {model}: {exc}")]) from exc
        if not self.http:
            from google.protobuf.json_format import MessageToDict

            meta = MessageToDict(meta, preserving_proto_field_name=True)
            config = MessageToDict(config.config, preserving_proto_field_name=True)
        batched = int(config.get("max_batch_size", 0)) > 0
        self.inputs = []
        for t in meta["inputs"]:
            shape = [int(d) for d in t["shape"]][1 if batched else 0 :]
            if t["datatype"] not in NUMPY:
                raise UserInputError(
                    [
                        FieldError(
                            "--model",
                            f"input {t['name']}: datatype {t['datatype']} is not benchmarkable",
                        )
                    ]
                )
            self.inputs.append((t["name"], [max(d, 1) for d in shape], t["datatype"]))
        self.batched = batched

    def request(self, sample: list[Any]) -> list[Any]:
        """InferInputs for one sample (a batch of one when the model batches)."""
        out = []
        for (name, _, datatype), array in zip(self.inputs, sample, strict=True):
            data = array[None] if self.batched else array
            inp = self.lib.InferInput(name, list(data.shape), datatype)
            inp.set_data_from_numpy(data)
            out.append(inp)
        return out

    def infer_async(self, inputs: list[Any], done: Any) -> None:
        """Send; call ``done(error or None)`` when the response is in."""
        if self.http:
            self._pool().submit(self._http_infer, inputs, done)
        else:
            self.client.async_infer(self.model, inputs,
                                    callback=lambda result, error: done(error))  # fmt: skip

    # tritonclient.http runs on gevent, which must not be shared between OS threads (it
    # crashes): HTTP requests go through a pool of threads with one client each.
    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="oip-http")
        return self._executor

    def _http_infer(self, inputs: list[Any], done: Any) -> None:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._new_client(1)
            with self._clients_lock:
                self._clients.append(client)
        try:
            client.infer(self.model, inputs)
        except Exception as exc:
            done(exc)
            return
        done(None)

    def _new_client(self, concurrency: int) -> Any:
        """A tritonclient client of this target, over TLS with ``tls`` (or an https URL)."""
        if self.http:
            tls = self.tls
            options = {"ca_certs": tls.ca} if tls else {}
            if tls and tls.cert and tls.key:
                options |= {"certfile": tls.cert, "keyfile": tls.key}
            secure = bool(tls) or self.url.startswith("https")
            return self.lib.InferenceServerClient(
                self.address, concurrency=concurrency, ssl=secure, ssl_options=options or None
            )
        if self.tls is None:
            return self.lib.InferenceServerClient(self.address)
        tls = self.tls
        return self.lib.InferenceServerClient(
            self.address, ssl=True, root_certificates=tls.ca, private_key=tls.key,
            certificate_chain=tls.cert)  # fmt: skip

    def infer(self, inputs: list[Any]) -> None:
        self.client.infer(self.model, inputs)

    def close(self) -> None:
        if self._executor is not None:
            workers = len(self._executor._threads)
            barrier = threading.Barrier(workers)

            def close_mine() -> None:  # each worker closes the client it made, in its thread
                barrier.wait(timeout=30)
                client = getattr(self._local, "client", None)
                if client is not None:
                    client.close()

            for _ in range(workers):
                self._executor.submit(close_mine)
            self._executor.shutdown(wait=True)
        self.client.close()


def samples_for(target: Target, count: int, seed: int) -> list[list[Any]]:
    """``count`` random samples with the model's input shapes and dtypes (seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        sample = []
        for _, shape, datatype in target.inputs:
            dtype = NUMPY[datatype]
            if dtype.startswith(("int", "uint")):
                sample.append(rng.integers(0, 10, size=shape).astype(dtype))
            elif dtype == "bool":
                sample.append(rng.integers(0, 2, size=shape).astype(bool))
            else:
                sample.append(rng.random(size=shape, dtype=np.float32).astype(dtype))
        out.append(sample)
    return out
