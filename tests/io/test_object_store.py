"""ObjectStorage against a real S3 endpoint (moto), and through a proxy that injects 503s."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrowlake.errors import StorageError
from arrowlake.io.object_store import ObjectStorage
from arrowlake.io.prefetch import FOOTERS, coalesce

pytestmark = pytest.mark.s3

_BUCKETS = iter(range(1, 1 << 30))


@pytest.fixture
def bucket(s3_server) -> str:
    return s3_server.create_bucket(f"unit-{os.getpid()}-{next(_BUCKETS)}")


@pytest.fixture
def storage(s3_server, bucket) -> ObjectStorage:
    return ObjectStorage(f"s3://{bucket}/base", s3_server.storage_options())


class FaultProxy:
    """An HTTP proxy to the S3 server that answers the first ``failures`` requests with 503."""

    def __init__(self, target: str, failures: int) -> None:
        self.failures = failures
        self.requests = 0
        proxy = self
        host, port = urlsplit(target).hostname, urlsplit(target).port

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy.requests += 1
                if proxy.failures != 0:
                    proxy.failures -= 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(host, port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(s3_server):
    p = FaultProxy(s3_server.endpoint, failures=0)
    yield p
    p.close()


def proxied(s3_server, proxy: FaultProxy, bucket: str, **extra: object) -> ObjectStorage:
    opts = {**s3_server.storage_options(), "endpoint": proxy.endpoint,
            "init_backoff": 0.01, "max_backoff": 0.05, **extra}
    return ObjectStorage(f"s3://{bucket}/base", opts)


def test_put_get_ranges_list_delete(storage, bucket):
    base = f"s3://{bucket}/base"
    storage.write_bytes(f"{base}/a/1.bin", b"0123456789")
    storage.write_bytes(f"{base}/a/2.bin", b"abc")
    storage.write_bytes(f"{base}/b/3.bin", b"x")
    assert storage.read_bytes(f"{base}/a/1.bin") == b"0123456789"
    assert bytes(storage.read_range(f"{base}/a/1.bin", 2, 5)) == b"234"
    assert bytes(storage.read_suffix(f"{base}/a/1.bin", 4)) == b"6789"
    listed = {f.path: f.size for f in storage.list_files(f"{base}/a")}
    assert listed == {f"{base}/a/1.bin": 10, f"{base}/a/2.bin": 3}
    assert len(storage.list_files(base)) == 3
    storage.delete([f"{base}/a/1.bin", f"{base}/a/2.bin", f"{base}/a/missing.bin"])
    assert [f.path for f in storage.list_files(base)] == [f"{base}/b/3.bin"]
    assert storage.list_files(f"{base}/nothing-here") == []


def test_missing_object_is_a_clear_error(storage, bucket):
    with pytest.raises(StorageError, match=r"s3://.*/base/nope.bin.*does not exist"):
        storage.read_bytes(f"s3://{bucket}/base/nope.bin")


def test_large_upload_is_multipart_and_reads_back(s3_server, bucket):
    storage = ObjectStorage(f"s3://{bucket}/base",
                            {**s3_server.storage_options(), "upload_part_bytes": 5 * 2**20})
    path = f"s3://{bucket}/base/big.parquet"
    table = pa.table({"x": pa.array(range(1_600_000), pa.int64())})
    with storage.open_output(path) as out:
        pq.write_table(table, out, compression="none")
        written = out.tell()
    assert written > 12 * 2**20  # three parts
    assert storage.list_files(f"s3://{bucket}/base")[0].size == written
    with storage.filesystem().open_input_file(storage.fs_path(path)) as f:
        assert pq.read_table(f).equals(table)


def test_unclosed_or_failed_upload_leaves_nothing(s3_server, bucket, proxy):
    storage = ObjectStorage(f"s3://{bucket}/base",
                            {**s3_server.storage_options(), "upload_part_bytes": 5 * 2**20})
    out = storage.open_output(f"s3://{bucket}/base/dropped.bin")
    out.write(b"x" * (6 * 2**20))  # one part already uploaded
    del out
    failing = proxied(s3_server, proxy, bucket, max_retries=1, upload_part_bytes=5 * 2**20)
    proxy.failures = -1  # every request fails
    out = failing.open_output(f"s3://{bucket}/base/failed.bin")
    with pytest.raises(StorageError, match="failed.bin"):
        out.write(b"y" * (11 * 2**20))
        out.close()
    out.close()  # closing a failed upload does not complete it
    proxy.failures = 0
    assert storage.list_files(f"s3://{bucket}/base") == []


def test_throttling_and_5xx_are_retried(s3_server, bucket, proxy):
    storage = proxied(s3_server, proxy, bucket)
    storage.write_bytes(f"s3://{bucket}/base/f.bin", b"payload")
    proxy.failures, proxy.requests = 3, 0
    assert storage.read_bytes(f"s3://{bucket}/base/f.bin") == b"payload"
    assert proxy.requests == 4


def test_clear_error_after_the_retry_budget(s3_server, bucket, proxy):
    storage = proxied(s3_server, proxy, bucket, max_retries=2)
    proxy.failures = -1
    start = time.monotonic()
    with pytest.raises(StorageError, match=r"Cannot read s3://.*/base/f.bin:.*503"):
        storage.read_bytes(f"s3://{bucket}/base/f.bin")
    assert proxy.requests == 3
    assert time.monotonic() - start < 5


def test_pickle_rebuilds_the_client(storage, bucket):
    storage.write_bytes(f"s3://{bucket}/base/p.bin", b"pickled")
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.read_bytes(f"s3://{bucket}/base/p.bin") == b"pickled"
    assert pickle.loads(pickle.dumps(storage.filesystem())) is not None


def test_explicit_endpoint_wins_over_environment(s3_server, bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    storage = ObjectStorage(f"s3://{bucket}/base", s3_server.storage_options())
    storage.write_bytes(f"s3://{bucket}/base/e.bin", b"ok")
    assert storage.read_bytes(f"s3://{bucket}/base/e.bin") == b"ok"
    assert os.environ["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9"


def test_credentials_from_environment(s3_server, bucket, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    storage = ObjectStorage(f"s3://{bucket}/base", {"endpoint": s3_server.endpoint})
    storage.write_bytes(f"s3://{bucket}/base/env.bin", b"env")
    assert storage.read_bytes(f"s3://{bucket}/base/env.bin") == b"env"


def test_a_process_that_imported_only_arrowlake_reaches_object_stores(storage, bucket):
    """Object stores register with the storage contract when arrowlake loads: storage_for
    finds them in a fresh process without any import of the backend module."""
    storage.write_bytes(f"s3://{bucket}/base/fresh.bin", b"registered")
    code = ("import json, sys\n"
            "import arrowlake\n"
            "from arrowlake.io.storage import storage_for\n"
            "s = storage_for(sys.argv[1], json.loads(sys.argv[2]))\n"
            "print(type(s).__name__, s.read_bytes(sys.argv[1] + '/fresh.bin').decode())\n")
    out = subprocess.run(
        [sys.executable, "-c", code, f"s3://{bucket}/base", json.dumps(storage.options)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ObjectStorage", "registered"]


def test_other_stores_are_reached_by_url():
    storage = ObjectStorage("gs://some-bucket/lake", {})
    assert storage.fs_path("gs://some-bucket/lake/t/x.parquet") == "lake/t/x.parquet"
    assert ObjectStorage("az://container/lake", {}).root == "az://container"


def test_coalesce():
    assert coalesce([(10, 20), (0, 5), (25, 30), (100, 110)], gap=5) == [(0, 30), (100, 110)]


def test_footers_are_cached(s3_server, bucket, proxy):
    storage = proxied(s3_server, proxy, bucket)
    path = f"s3://{bucket}/base/t.parquet"
    with storage.open_output(path) as out:
        pq.write_table(pa.table({"a": range(1000), "b": ["x"] * 1000}), out)
    size = storage.list_files(path.rsplit("/", 1)[0])[0].size
    import pyarrow.dataset as ds

    from arrowlake.io.prefetch import FileRef, prefetched_windows

    fmt = ds.ParquetFileFormat()
    FOOTERS.clear()
    for expected_requests in (1, 0):  # small file: the footer request brings it whole
        proxy.requests = 0
        [window] = prefetched_windows(storage, [FileRef(path, size)], fmt, columns=["a"],
                                      filter=None, schema=None)
        table = ds.FileSystemDataset(window.fragments, pa.schema([("a", pa.int64()),
                                                                  ("b", pa.string())]),
                                     fmt, window.filesystem).to_table(columns=["a"])
        assert table.num_rows == 1000
        assert proxy.requests <= max(expected_requests, 1)
    assert FOOTERS.hits >= 1
