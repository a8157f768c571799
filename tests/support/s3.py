"""Object stores for the tests, on 127.0.0.1: a real S3 server, versitygw (built from its Go
module by scripts/build-controlplane.sh), and moto's S3 stand-in.

versitygw rather than MinIO: MinIO's server repository is archived and AGPL; versitygw is
maintained, Apache-2.0, and serves real S3 semantics (SigV4, multipart uploads, conditional
errors such as BucketNotEmpty) over a plain directory, so a test can also corrupt or remove an
object's file underneath it. Its keys are that directory's paths: ``a`` and ``a/b`` cannot both
exist, which checkpoint layouts never need.

An ``S3`` server can be stopped and started again on the same port and data (an outage).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devcluster.build import binaries_dir
from gpufleet.net import free_port
from tests.support.procs import poll_until, stop_processes

VERSITYGW = binaries_dir() / "versitygw"
needs_versitygw = pytest.mark.skipif(
    not VERSITYGW.is_file(),
    reason=f"versitygw not built at {VERSITYGW} (make test builds it: "
    "scripts/build-controlplane.sh versitygw)",
)


@dataclass
class S3:
    """An S3 endpoint and the AWS_* variables that reach it (boto3, s3fs and a worker's
    environment read them)."""

    endpoint: str
    access_key: str
    secret_key: str
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    data: Path | None = None  # versitygw: the directory holding the buckets
    log: Path | None = None
    iam: Path | None = None  # versitygw: its own accounts' directory (--iam-dir), if any

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )

    def fs(self) -> Any:
        """A fresh s3fs filesystem on this endpoint (no listing cache shared with others)."""
        import s3fs

        return s3fs.S3FileSystem(
            key=self.access_key,
            secret=self.secret_key,
            endpoint_url=self.endpoint,
            skip_instance_cache=True,
        )

    def bucket(self, name: str) -> str:
        """Create bucket ``name``; returns ``s3://name``."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def account(self, access_key: str, role: str = "userplus") -> S3:
        """A new account of this server (versitygw's admin API, with --iam-dir): its own
        credentials, which reach only its own buckets ("userplus" may create them)."""
        assert self.iam is not None, "accounts need versitygw(..., iam=True)"
        secret_key = secrets.token_hex(20)
        made = subprocess.run(
            [str(VERSITYGW), "admin", "--access", self.access_key, "--secret", self.secret_key,
             "--endpoint-url", self.endpoint, "create-user", "--access", access_key,
             "--secret", secret_key, "--role", role],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        return S3(endpoint=self.endpoint, access_key=access_key, secret_key=secret_key)

    def stop(self) -> None:
        """The server goes away (an outage); ``start()`` brings it back on the same port."""
        if self.proc is not None:
            stop_processes([self.proc])
            self.proc = None

    def start(self) -> None:
        assert self.data is not None and self.log is not None, "only versitygw restarts"
        address = self.endpoint.removeprefix("http://")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(VERSITYGW), "--port", address, "--health", "/health", "--quiet",
                 *(["--iam-dir", str(self.iam)] if self.iam else []), "posix", str(self.data)],
                env={**os.environ, "ROOT_ACCESS_KEY_ID": self.access_key,
                     "ROOT_SECRET_ACCESS_KEY": self.secret_key},
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            poll_until(lambda: _healthy(f"{self.endpoint}/health"), what="versitygw healthy",
                       timeout=60, alive=self.proc, retry_on=(OSError,))  # fmt: skip
        except pytest.fail.Exception as e:
            pytest.fail(f"{e}\n{self.log.read_text(errors='replace')[-3000:]}")


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bool(resp.status == 200)


@contextmanager
def versitygw(directory: Path, host: str = "127.0.0.1", iam: bool = False) -> Iterator[S3]:
    """versitygw on ``host`` serving the buckets of ``directory``/s3 (with ``iam``, accounts
    of its own in ``directory``/iam: S3.account); stopped on exit."""
    data = directory / "s3"
    data.mkdir(parents=True, exist_ok=True)
    if iam:
        (directory / "iam").mkdir(exist_ok=True)
    server = S3(
        endpoint=f"http://{host}:{free_port()}",
        access_key=f"gpufleet-{secrets.token_hex(4)}",
        secret_key=secrets.token_hex(20),
        data=data,
        log=directory / "versitygw.log",
        iam=directory / "iam" if iam else None,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def moto() -> Iterator[S3]:
    """moto's S3 server (a Python stand-in) on 127.0.0.1."""
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3(endpoint=f"http://{host}:{port}", access_key="test", secret_key="test")
    finally:
        server.stop()


@contextmanager
def in_environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in this process's environment (s3fs and boto3 read it), restored after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def bucket_env(directory: Path, bucket: str) -> Iterator[S3]:
    """versitygw with ``bucket``, in this process's environment (s3fs reads it), s3fs's
    instances cleared before and after (one per set of arguments: another server's must not
    be reused)."""
    import s3fs

    with versitygw(directory) as server, in_environment(server.env):
        s3fs.S3FileSystem.clear_instance_cache()
        server.bucket(bucket)
        yield server
    s3fs.S3FileSystem.clear_instance_cache()
