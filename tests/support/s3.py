"""Real S3 servers for tests: a moto_server subprocess on loopback, or the Ceph RGW that `scripts/ceph-rgw`
started (GENBATCH_TEST_CEPH_ENDPOINT, plus _ACCESS_KEY / _SECRET_KEY when not the script's defaults).

    with MotoServer() as server:
        bucket = server.endpoint.create_bucket()
        store = RunStore(f"s3://{bucket}/run", server.endpoint.storage_options())

Subprocesses (a `gen run` under test) get the same server through `endpoint.env()`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

from tests.support.distributed import free_port

CEPH_ENV = "GENBATCH_TEST_CEPH_ENDPOINT"
CEPH_DEFAULT_KEYS = ("genbatch", "genbatch-secret")  # what scripts/ceph-rgw creates


@dataclass(kw_only=True, slots=True)
class S3Endpoint:
    """One reachable S3 API and the credentials to use it."""

    name: str
    """"moto" or "ceph": which server answers."""
    endpoint_url: str
    """http://127.0.0.1:PORT"""
    key: str = "testing"
    """Access key id."""
    secret: str = "testing"
    """Secret access key."""
    region: str = "us-east-1"
    """Region name the clients sign for."""
    buckets: list[str] = field(default_factory=list)
    """Buckets created through this endpoint (for clean-up)."""
    admin: object = None
    """A cached s3fs filesystem for bucket set-up and checks (creating one costs ~0.3 s)."""

    def storage_options(self, endpoint_url: str | None = None) -> dict:
        """fsspec/s3fs options for this server (or for a proxy in front of it)."""
        return {
            "key": self.key,
            "secret": self.secret,
            "endpoint_url": endpoint_url or self.endpoint_url,
            "client_kwargs": {"region_name": self.region},
        }

    def env(self) -> dict[str, str]:
        """Environment variables that point s3fs clients in a subprocess at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self, endpoint_url: str | None = None):
        """An s3fs filesystem on this server (the cached one unless another endpoint_url is asked for)."""
        import s3fs

        if endpoint_url is None and self.admin is not None:
            return self.admin
        fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False,
                               **self.storage_options(endpoint_url))
        if endpoint_url is None:
            self.admin = fs
        return fs

    def create_bucket(self) -> str:
        bucket = f"gb-{uuid.uuid4().hex[:12]}"
        self.filesystem().call_s3("create_bucket", Bucket=bucket)
        self.buckets.append(bucket)
        return bucket

    def delete_bucket(self, bucket: str) -> None:
        fs = self.filesystem()
        try:
            fs.clear_multipart_uploads(bucket)
            fs.rm(bucket, recursive=True)
        except FileNotFoundError:
            pass


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {proc.returncode} before it was ready")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers: ready
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


class MotoServer:
    """`moto_server -H 127.0.0.1 -p PORT` as a subprocess; ready when it answers HTTP; stopped by its pid."""

    def __init__(self, extra_env: dict[str, str] | None = None):
        self.port = free_port()
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen | None = None
        self.endpoint = S3Endpoint(name="moto", endpoint_url=f"http://127.0.0.1:{self.port}")

    def start(self) -> "MotoServer":
        exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
        if exe is None:
            raise RuntimeError("moto_server not found: install the test extras (pip install -e '.[test]')")
        env = {**os.environ, **self.extra_env}
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_http(self.endpoint.endpoint_url, 30, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> "MotoServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def ceph_endpoint() -> S3Endpoint | None:
    """The Ceph RGW named by GENBATCH_TEST_CEPH_ENDPOINT, or None when unset."""
    url = os.environ.get(CEPH_ENV)
    if not url:
        return None
    return S3Endpoint(
        name="ceph",
        endpoint_url=url,
        key=os.environ.get("GENBATCH_TEST_CEPH_ACCESS_KEY", CEPH_DEFAULT_KEYS[0]),
        secret=os.environ.get("GENBATCH_TEST_CEPH_SECRET_KEY", CEPH_DEFAULT_KEYS[1]),
        region=os.environ.get("GENBATCH_TEST_CEPH_REGION", "us-east-1"),
    )
