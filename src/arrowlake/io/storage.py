"""Where data files live: a small storage contract and its local-disk backend.

Table code speaks only to :class:`Storage`; a backend turns its calls into filesystem or object
store requests. Other backends register the location schemes they serve
(:func:`register_backend`); :func:`storage_for` picks one by the location's scheme. Storage SDKs
are imported only in their backend module, when first used.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from arrowlake.errors import DataFileError, StorageError, ValidationError


@dataclass(frozen=True)
class FileInfo:
    path: str  # absolute location, as Storage methods take it
    size: int
    mtime_ms: int | None


class Storage(ABC):
    """The operations arrowlake needs from a place that holds files.

    Paths are absolute locations under the backend's scheme: a local path for
    :class:`LocalStorage`, ``s3://bucket/key`` for object stores. Instances are picklable, so
    a split carries its storage to another process.
    """

    #: Whether the backend has cheap, atomic renames (object stores do not).
    atomic_rename: bool = False
    #: Whether each request costs tens of milliseconds (object stores): readers then fetch
    #: footers and column chunks concurrently up front instead of letting pyarrow read on demand.
    high_latency: bool = False
    #: How many requests a reader keeps in flight on this storage.
    max_in_flight: int = 16

    @abstractmethod
    def filesystem(self) -> pafs.FileSystem:
        """A pyarrow filesystem for pyarrow's readers, with paths from :meth:`fs_path`."""

    @abstractmethod
    def fs_path(self, path: str) -> str:
        """``path`` as the pyarrow filesystem of :meth:`filesystem` names it."""

    @abstractmethod
    def open_output(self, path: str) -> pa.NativeFile:
        """A writable stream; the file becomes visible complete or not at all where possible."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes: ...

    @abstractmethod
    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a file."""

    @abstractmethod
    def read_suffix(self, path: str, length: int) -> bytes:
        """The last ``length`` bytes of a file (all of it if it is shorter)."""

    async def read_range_async(self, path: str, start: int, end: int) -> bytes:
        return await asyncio.to_thread(self.read_range, path, start, end)

    async def read_suffix_async(self, path: str, length: int) -> bytes:
        return await asyncio.to_thread(self.read_suffix, path, length)

    @abstractmethod
    def file_size(self, path: str) -> int | None:
        """The size of a file in bytes, None if it does not exist."""

    @abstractmethod
    def delete(self, paths: Iterable[str]) -> None:
        """Delete files; missing ones are ignored."""

    @abstractmethod
    def list_files(self, prefix: str) -> list[FileInfo]:
        """Every file below ``prefix`` (recursively)."""

    def list_children(self, prefix: str) -> tuple[list[FileInfo], list[str]]:
        """The files directly in ``prefix`` and its subdirectories (absolute), for listing a
        large tree in parallel. Backends override it with a one-level listing; this one lists
        everything below."""
        base = prefix.rstrip("/") + "/"
        files, dirs = [], set()
        for f in self.list_files(prefix):
            rest = f.path[len(base):]
            if "/" in rest:
                dirs.add(base + rest.split("/", 1)[0])
            else:
                files.append(f)
        return files, sorted(dirs)

    def join(self, base: str, *parts: str) -> str:
        out = base.rstrip("/")
        for part in parts:
            out = f"{out}/{part.strip('/')}"
        return out

    def relative(self, base: str, path: str) -> str:
        prefix = base.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise ValidationError(f"{path!r} is not below {base!r}")
        return path[len(prefix):]


#: How many created directories a :class:`LocalStorage` remembers (then it starts over).
_MADE_DIRS_LIMIT = 4096


class LocalStorage(Storage):
    """Files on a local (or mounted) filesystem."""

    atomic_rename = True

    def __init__(self) -> None:
        self._fs = pafs.LocalFileSystem()
        # Directories this object created or found: each file's makedirs call costs a few
        # system calls, for nothing after the first file of a directory.
        self._made_dirs: set[str] = set()

    def __reduce__(self) -> tuple[Any, ...]:
        return (LocalStorage, ())

    def filesystem(self) -> pafs.FileSystem:
        return self._fs

    def fs_path(self, path: str) -> str:
        return path

    def open_output(self, path: str) -> pa.NativeFile:
        directory = os.path.dirname(path)
        known = directory in self._made_dirs
        try:
            if not known:
                os.makedirs(directory, exist_ok=True)
            try:
                stream = self._fs.open_output_stream(path)
            except OSError:
                if not known:
                    raise
                # Deleted since we made it (a dropped table, a cleanup): make it again.
                os.makedirs(directory, exist_ok=True)
                stream = self._fs.open_output_stream(path)
        except OSError as exc:
            self._made_dirs.discard(directory)
            raise StorageError(f"Cannot create {path}: {exc}") from exc
        if not known:
            if len(self._made_dirs) >= _MADE_DIRS_LIMIT:
                self._made_dirs.clear()
            self._made_dirs.add(directory)
        return stream

    def read_bytes(self, path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise StorageError(f"Cannot read {path}: {exc}") from exc

    def read_range(self, path: str, start: int, end: int) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(end - start)
        except OSError as exc:
            raise StorageError(f"Cannot read {path}: {exc}") from exc

    def read_suffix(self, path: str, length: int) -> bytes:
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - length))
                return f.read()
        except OSError as exc:
            raise StorageError(f"Cannot read {path}: {exc}") from exc

    def file_size(self, path: str) -> int | None:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"Cannot inspect {path}: {exc}") from exc

    def delete(self, paths: Iterable[str]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def list_files(self, prefix: str) -> list[FileInfo]:
        out: list[FileInfo] = []
        if not os.path.isdir(prefix):
            return out
        for root, _dirs, names in os.walk(prefix):
            for name in names:
                full = os.path.join(root, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                out.append(FileInfo(full, st.st_size, int(st.st_mtime * 1000)))
        return out

    def list_children(self, prefix: str) -> tuple[list[FileInfo], list[str]]:
        files: list[FileInfo] = []
        dirs: list[str] = []
        try:
            entries = list(os.scandir(prefix))
        except (FileNotFoundError, NotADirectoryError):
            return files, dirs
        for entry in entries:
            try:
                if entry.is_dir():
                    dirs.append(entry.path)
                else:
                    st = entry.stat()
                    files.append(FileInfo(entry.path, st.st_size, int(st.st_mtime * 1000)))
            except FileNotFoundError:
                continue
        return files, sorted(dirs)


def discard_after_failure(storage: Storage, paths: Sequence[str]) -> None:
    """Delete the files of a write that failed, from the ``except`` block handling its error.

    When the deletion fails too (the storage is down, credentials expired, ...), the write's
    own error is what the caller raises: the deletion's failure is attached to it as a note
    instead of replacing it. Called with no error being handled, a failure raises as usual.
    """
    if not paths:
        return
    failure = sys.exc_info()[1]
    try:
        storage.delete(paths)
    except Exception as cleanup:
        if failure is None:
            raise
        failure.add_note(
            f"Deleting the {len(paths)} file(s) this write had written also failed "
            f"({type(cleanup).__name__}: {cleanup}). They are not part of the table; "
            "remove_orphan_files() deletes them once the storage is reachable again.")


def data_file_damage(storage: Storage, path: str, size: int, *,
                     read_all: bool = False) -> str | None:
    """What is wrong with the Parquet data file at ``path`` that was written with ``size``
    bytes (missing, truncated, overwritten; with ``read_all`` also pages that do not decode),
    or None when nothing is."""
    actual = storage.file_size(path)
    if actual is None:
        return "does not exist"
    if actual != size:
        return f"has {actual} bytes where {size} were written (truncated or replaced)"
    if size < 12 or storage.read_suffix(path, 4) != b"PAR1":
        return "is not a Parquet file any more (no PAR1 trailer)"
    if not read_all:
        return None
    try:
        with storage.filesystem().open_input_file(storage.fs_path(path)) as source:
            for _ in pq.ParquetFile(source).iter_batches(batch_size=65_536):
                pass
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, StorageError) and not isinstance(exc, DataFileError):
            raise  # the storage failed, not the file
        return f"is corrupt ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    return None


def split_scheme(location: str) -> tuple[str, str]:
    if "://" in location:
        scheme, rest = location.split("://", 1)
        return scheme.lower(), rest
    return "file", location


#: Builds the storage of a location from it and its ``storage_options``.
BackendFactory = Callable[[str, dict[str, Any]], Storage]

_BACKENDS: dict[str, BackendFactory] = {}


def register_backend(schemes: Iterable[str], factory: BackendFactory) -> None:
    """Serve locations of ``schemes`` (``"s3"``, ...) with storages built by ``factory``.

    Backend modules call this when imported; :mod:`arrowlake.io` imports those that ship with
    arrowlake, so every process that uses arrowlake has them registered.
    """
    for scheme in schemes:
        _BACKENDS[scheme.lower()] = factory


def storage_for(location: str, options: Mapping[str, Any] | None = None) -> Storage:
    """The storage backend for a location: a local path, ``file://``, or an object store URL."""
    scheme, _ = split_scheme(location)
    if scheme == "file":
        return LocalStorage()
    factory = _BACKENDS.get(scheme)
    if factory is not None:
        return factory(location, dict(options or {}))
    raise ValidationError(
        f"Unsupported storage location {location!r}: use a local path, file://, or s3://"
    )


def is_within(path: str, location: str) -> bool:
    """Whether ``path`` is ``location`` or below it (both normalized, same scheme)."""
    return path == location or path.startswith(location.rstrip("/") + "/")


def normalize_location(location: str) -> str:
    scheme, rest = split_scheme(location)
    if scheme == "file":
        return os.path.abspath(os.path.expanduser(rest)).rstrip("/") or "/"
    return f"{scheme}://{rest.rstrip('/')}"
