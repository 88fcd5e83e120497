"""Object stores (S3, and GCS / Azure through the same URLs) as arrowlake storage, on obstore.

obstore is the Rust ``object_store`` crate: requests are async and run on its own runtime with
the GIL released, retries with exponential backoff are built in, and writes stream through
multipart uploads. This module is the only one that imports it, at first use (the ``s3`` extra);
importing :mod:`arrowlake.io` registers :class:`ObjectStorage` for object store URLs.

Options come from ``storage_options`` (``endpoint``, ``region``, ``access_key_id``,
``secret_access_key``, ``session_token``, ``allow_http``, ``virtual_hosted_style_request``, ...,
any obstore store config key) on top of the usual ``AWS_*`` environment variables, which obstore
reads itself. arrowlake's own options: ``max_in_flight`` (concurrent requests per reader,
default 16), ``max_retries`` (default 5), ``retry_timeout`` (default ``"60s"``),
``init_backoff`` / ``max_backoff``, ``timeout`` / ``connect_timeout`` (HTTP client), ``profile``
(an AWS profile, resolved through boto3 when installed).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from arrowlake.errors import StorageError, ValidationError, require
from arrowlake.io.object_files import ObjectFileSystemHandler, UploadStream
from arrowlake.io.storage import FileInfo, Storage, register_backend, split_scheme

if TYPE_CHECKING:
    from obstore.store import ObjectStore

#: The location schemes object stores serve (obstore's ``from_url``).
SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "memory")

# obstore HTTP client options; everything else (but arrowlake's own keys) is store config.
_CLIENT_KEYS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "default_headers", "http1_only", "http2_only", "pool_idle_timeout", "pool_max_idle_per_host",
    "proxy_url", "proxy_ca_certificate", "proxy_excludes", "randomize_addresses",
    "read_timeout", "timeout", "user_agent",
})
_OWN_KEYS = frozenset({"max_in_flight", "max_retries", "retry_timeout", "init_backoff",
                       "max_backoff", "profile", "upload_part_bytes"})
_TRUE = {"1", "true", "yes", "on"}

# AWS_ENDPOINT_URL_S3 takes precedence over an explicit `endpoint` inside obstore, and cannot be
# overridden through its config. An explicit option should win over the environment, so the
# variable is hidden while such a store is built (the lock keeps two builds from interleaving).
_ENV_LOCK = threading.Lock()
_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3",)


@functools.cache
def _obstore() -> Any:
    """The obstore module, imported when an object store is first used."""
    return require("obstore", "s3", "Object storage (s3://, gs://, az://)")


def _duration(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    text = str(value).strip()
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(suffix):
            try:
                return timedelta(seconds=float(text[: -len(suffix)]) * scale)
            except ValueError:
                break
    try:
        return timedelta(seconds=float(text))
    except ValueError:
        raise ValidationError(f"Not a duration: {value!r} (use seconds, or '500ms', '30s')") \
            from None


def _bucket_root(location: str) -> tuple[str, str]:
    """(``scheme://bucket``, path of ``location`` inside the bucket)."""
    scheme, rest = split_scheme(location)
    bucket, _, key = rest.partition("/")
    if scheme != "memory" and not bucket:
        raise ValidationError(f"Object store location {location!r} names no bucket")
    return f"{scheme}://{bucket}", key.strip("/")


class ObjectStorage(Storage):
    """Files in one bucket of an object store; paths are full URLs (``s3://bucket/key``).

    >>> storage = ObjectStorage("s3://analytics/lake", {"region": "us-east-1"})  # doctest: +SKIP
    >>> storage.read_bytes("s3://analytics/lake/t/data/x.parquet")  # doctest: +SKIP
    """

    atomic_rename = False
    high_latency = True

    def __init__(self, location: str, options: Mapping[str, Any] | None = None) -> None:
        _obstore()  # without obstore installed, fail here, naming the extra to install
        self.location = location
        self.options = dict(options or {})
        self.root, _ = _bucket_root(location)
        self.max_in_flight = int(self.options.get("max_in_flight", 16))
        if self.max_in_flight < 1:
            raise ValidationError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        self.upload_part_bytes = int(self.options.get("upload_part_bytes", 10 * 1024 * 1024))
        self._store: ObjectStore | None = None
        self._fs: pafs.PyFileSystem | None = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        # The store (an HTTP client) is rebuilt lazily in the receiving process.
        return (ObjectStorage, (self.location, self.options))

    def __repr__(self) -> str:
        return f"ObjectStorage({self.root!r})"

    # -- the obstore client --------------------------------------------------------------------

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    self._store = self._build_store()
        return self._store

    def _build_store(self) -> ObjectStore:
        config: dict[str, Any] = {}
        client: dict[str, Any] = dict(self.options.get("client_options") or {})
        for key, value in self.options.items():
            if key == "client_options" or key in _OWN_KEYS:
                continue
            if key in _CLIENT_KEYS:
                client[key] = value
            else:
                config[key] = value
        if "allow_http" in client and isinstance(client["allow_http"], str):
            client["allow_http"] = client["allow_http"].lower() in _TRUE
        for key in ("timeout", "connect_timeout"):
            if key in client and not isinstance(client[key], str):
                client[key] = _duration(client[key])
        if client and "allow_http" not in client and os.environ.get("AWS_ALLOW_HTTP"):
            # explicit client options replace those obstore would read from the environment
            client["allow_http"] = os.environ["AWS_ALLOW_HTTP"].lower() in _TRUE
        retry = {
            "max_retries": int(self.options.get("max_retries", 5)),
            "retry_timeout": _duration(self.options.get("retry_timeout", 60)),
            "backoff": {
                "init_backoff": _duration(self.options.get("init_backoff", 0.1)),
                "max_backoff": _duration(self.options.get("max_backoff", 5)),
                "base": 2,
            },
        }
        provider = self._profile_credentials(config)
        kwargs: dict[str, Any] = dict(config=config or None, client_options=client or None,
                                      retry_config=retry)
        if provider is not None:
            kwargs["credential_provider"] = provider
        try:
            if "endpoint" in config or "aws_endpoint" in config:
                with _ENV_LOCK:
                    hidden = {k: os.environ.pop(k) for k in _ENDPOINT_ENV if k in os.environ}
                    try:
                        return _obstore().store.from_url(self.root, **kwargs)
                    finally:
                        os.environ.update(hidden)
            return _obstore().store.from_url(self.root, **kwargs)
        except Exception as exc:
            raise StorageError(f"Cannot configure object store {self.root}: {exc}") from exc

    def _profile_credentials(self, config: dict[str, Any]) -> Any:
        """A boto3-backed credential provider for an AWS profile (``profile`` / AWS_PROFILE)."""
        profile = self.options.get("profile") or os.environ.get("AWS_PROFILE")
        if not profile or not self.root.startswith(("s3://", "s3a://")):
            return None
        if "access_key_id" in config or os.environ.get("AWS_ACCESS_KEY_ID"):
            return None  # explicit keys win over a profile
        try:
            import boto3
            from obstore.auth.boto3 import Boto3CredentialProvider
        except ImportError as exc:
            raise StorageError(
                f"AWS profile {profile!r} needs boto3 to resolve credentials: pip install boto3"
            ) from exc
        session = boto3.Session(profile_name=profile)
        if "region" not in config and session.region_name:
            config["region"] = session.region_name
        return Boto3CredentialProvider(session)

    def key(self, path: str) -> str:
        """The object key of an absolute location in this storage's bucket."""
        prefix = self.root + "/"
        if not path.startswith(prefix):
            raise ValidationError(f"{path!r} is not in {self.root}")
        return path[len(prefix):]

    def url(self, key: str) -> str:
        return f"{self.root}/{key}"

    def storage_error(self, action: str, path: str, exc: BaseException) -> StorageError:
        if isinstance(exc, StorageError):
            return exc
        if isinstance(exc, FileNotFoundError):
            return StorageError(f"Cannot {action} {path}: it does not exist")
        detail = str(exc).split("\n\nDebug source:", 1)[0].strip()
        return StorageError(f"Cannot {action} {path}: {detail}")

    # -- pyarrow -------------------------------------------------------------------------------

    def filesystem(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs = pafs.PyFileSystem(ObjectFileSystemHandler(self))
        return self._fs

    def fs_path(self, path: str) -> str:
        return self.key(path)

    # -- reading -------------------------------------------------------------------------------

    def read_bytes(self, path: str) -> bytes:
        try:
            return _obstore().get(self.store, self.key(path)).bytes().to_bytes()
        except Exception as exc:
            raise self.storage_error("read", path, exc) from exc

    def read_range(self, path: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            return _obstore().get_range(self.store, self.key(path), start=start, end=end)
        except Exception as exc:
            raise self.storage_error("read", path, exc) from exc

    def read_suffix(self, path: str, length: int) -> bytes:
        try:
            result = _obstore().get(self.store, self.key(path),
                                    options={"range": {"suffix": length}})
            return result.bytes()
        except Exception as exc:
            raise self.storage_error("read", path, exc) from exc

    async def read_range_async(self, path: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            return await _obstore().get_range_async(
                self.store, self.key(path), start=start, end=end)
        except Exception as exc:
            raise self.storage_error("read", path, exc) from exc

    async def read_suffix_async(self, path: str, length: int) -> bytes:
        try:
            result = await _obstore().get_async(self.store, self.key(path),
                                                options={"range": {"suffix": length}})
            return await result.bytes_async()
        except Exception as exc:
            raise self.storage_error("read", path, exc) from exc

    def file_size(self, path: str) -> int | None:
        try:
            return int(_obstore().head(self.store, self.key(path))["size"])
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self.storage_error("inspect", path, exc) from exc

    def size(self, path: str) -> int:
        try:
            return int(_obstore().head(self.store, self.key(path))["size"])
        except Exception as exc:
            raise self.storage_error("inspect", path, exc) from exc

    # -- writing -------------------------------------------------------------------------------

    def open_output(self, path: str) -> pa.NativeFile:
        try:
            writer = _obstore().open_writer(self.store, self.key(path),
                                            buffer_size=self.upload_part_bytes)
        except Exception as exc:
            raise self.storage_error("create", path, exc) from exc
        return pa.PythonFile(UploadStream(self, path, writer), mode="w")

    def write_bytes(self, path: str, data: bytes) -> None:
        try:
            _obstore().put(self.store, self.key(path), data)
        except Exception as exc:
            raise self.storage_error("write", path, exc) from exc

    def delete(self, paths: Iterable[str]) -> None:
        keys = [self.key(p) for p in paths]
        # S3 deletes up to 1000 keys per request; a missing key is not an error there.
        for start in range(0, len(keys), 1000):
            chunk = keys[start:start + 1000]
            try:
                _obstore().delete(self.store, chunk)
            except FileNotFoundError:
                pass
            except Exception as exc:
                raise self.storage_error("delete", self.url(chunk[0]), exc) from exc

    def list_files(self, prefix: str) -> list[FileInfo]:
        key = self.key(prefix.rstrip("/") + "/") if prefix.rstrip("/") != self.root else ""
        out: list[FileInfo] = []
        try:
            for chunk in _obstore().list(self.store, key or None, chunk_size=1000):
                for meta in chunk:
                    modified = meta.get("last_modified")
                    mtime = int(modified.timestamp() * 1000) if modified is not None else None
                    out.append(FileInfo(self.url(meta["path"]), int(meta["size"]), mtime))
        except Exception as exc:
            raise self.storage_error("list", prefix, exc) from exc
        return out

    def list_children(self, prefix: str) -> tuple[list[FileInfo], list[str]]:
        key = self.key(prefix.rstrip("/") + "/") if prefix.rstrip("/") != self.root else ""
        try:
            listed = _obstore().list_with_delimiter(self.store, key or None)
        except Exception as exc:
            raise self.storage_error("list", prefix, exc) from exc
        files = [FileInfo(self.url(meta["path"]), int(meta["size"]),
                          int(meta["last_modified"].timestamp() * 1000)
                          if meta.get("last_modified") is not None else None)
                 for meta in listed["objects"]]
        return files, sorted(self.url(p) for p in listed["common_prefixes"])


register_backend(SCHEMES, ObjectStorage)
