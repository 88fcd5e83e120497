"""File objects over object-store objects, for pyarrow.

* :class:`UploadStream` — what :meth:`ObjectBackend.open_output` wraps in ``pa.PythonFile``:
  bytes stream into an obstore writer, which uploads parts of ``upload_part_bytes`` as a
  multipart upload while the rest of the file is still being written, and completes the upload
  on ``close()``. An upload that is never closed never becomes visible.
* :class:`ObjectFileSystemHandler` — a ``pyarrow.fs.PyFileSystem`` handler. Files open with a
  size the caller already knows (no HEAD) and serve reads from buffers a reader prefetched
  (see :mod:`arrowlake.io.prefetch`); a read outside them becomes one range GET.
"""

from __future__ import annotations

import atexit
import bisect
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from arrowlake.errors import StorageError
from arrowlake.io.storage import FileInfo


class ObjectBackend(Protocol):
    """What the file objects here use of their storage (:class:`~arrowlake.io.object_store.
    ObjectStorage`, which builds them): its paths, sizes, ranges, listing and errors."""

    def storage_error(self, action: str, path: str, exc: BaseException) -> StorageError: ...

    def read_range(self, path: str, start: int, end: int) -> bytes: ...

    def url(self, key: str) -> str: ...

    def key(self, path: str) -> str: ...

    def size(self, path: str) -> int: ...

    def list_files(self, prefix: str) -> list[FileInfo]: ...

    def open_output(self, path: str) -> pa.NativeFile: ...

    def delete(self, paths: Iterable[str]) -> None: ...


class UploadStream:
    """A write-only, Python-file-like upload of one object."""

    def __init__(self, storage: ObjectBackend, path: str, writer: Any) -> None:
        self._storage = storage
        self._path = path
        self._writer = writer
        self._closed = False
        self._failed = False
        self._position = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def write(self, data: Any) -> int:
        if self._closed:
            raise StorageError(f"Cannot write {self._path}: the upload is closed")
        view = memoryview(data)
        if view.format != "B" or not view.c_contiguous:
            view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        try:
            n = self._writer.write(view)
        except Exception as exc:
            self._failed = True
            raise self._storage.storage_error("upload", self._path, exc) from exc
        self._position += n
        return n

    def flush(self) -> None:
        pass  # parts are uploaded as they fill; the last one on close

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._failed:
            # Never complete a broken upload: the object must not appear half-written.
            self._writer = None
            return
        try:
            self._writer.close()
        except Exception as exc:
            raise self._storage.storage_error("upload", self._path, exc) from exc
        finally:
            self._writer = None


@dataclass
class PrefetchedFile:
    """Byte ranges of one object already in memory, sorted by offset, not overlapping."""

    size: int
    starts: list[int] = field(default_factory=list)
    buffers: list[Any] = field(default_factory=list)  # bytes-like, zero-copy from obstore

    def add(self, start: int, data: Any) -> None:
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.buffers.insert(i, data)

    def covers(self, start: int, end: int) -> bool:
        return all(hole[0] >= hole[1] for hole in self.holes(start, end))

    def holes(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` not held in memory."""
        out = []
        pos = start
        i = max(0, bisect.bisect_right(self.starts, pos) - 1)
        while pos < end and i < len(self.starts):
            s, e = self.starts[i], self.starts[i] + len(self.buffers[i])
            if e <= pos:
                i += 1
                continue
            if s > pos:
                out.append((pos, min(s, end)))
            pos = max(pos, e)
            i += 1
        if pos < end:
            out.append((pos, end))
        return out

    def read(self, start: int, end: int) -> Any:
        """``[start, end)`` if it lies in one buffer (zero-copy), else None."""
        i = bisect.bisect_right(self.starts, start) - 1
        if i >= 0:
            s = self.starts[i]
            buf = self.buffers[i]
            if end <= s + len(buf):
                return memoryview(buf)[start - s:end - s]
        return None


class _ExitGate:
    """Keeps Arrow's threads out of Python once the interpreter starts to shut down.

    pyarrow reads these files from its own C++ thread pools, calling into Python for every
    read. A thread that asks for the GIL after the interpreter began finalizing is ended on the
    spot (``pthread_exit``): the Arrow pool that owned it then waits for it forever when the
    process exits, or the C++ runtime aborts ("terminate called without an active
    exception"). That happened to short-lived processes that left a scan unfinished, its
    read-ahead still queued. At exit, while threads may still run Python, the gate closes:
    reads already inside finish, later ones fail at once, and :meth:`close` waits until no
    read has entered for a moment (bounded), so the read-ahead drains before finalization.
    """

    QUIET = 0.05
    LIMIT = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._last_entry = 0.0
        self.closed = False

    def enter(self, path: str) -> None:
        with self._lock:
            self._last_entry = time.monotonic()
            if self.closed:
                raise StorageError(f"Cannot read {path}: the Python interpreter is shutting down")
            self._inside += 1

    def leave(self) -> None:
        with self._lock:
            self._inside -= 1

    def close(self) -> None:
        with self._lock:
            self.closed = True
        deadline = time.monotonic() + self.LIMIT
        while time.monotonic() < deadline:
            with self._lock:
                quiet = self._inside == 0 and time.monotonic() - self._last_entry >= self.QUIET
            if quiet:
                return
            time.sleep(self.QUIET / 5)

    def reset(self) -> None:
        """In a forked child: the parent's reads in flight are not the child's."""
        self._lock = threading.Lock()
        self._inside = 0
        self.closed = False


_GATE = _ExitGate()
atexit.register(_GATE.close)
os.register_at_fork(after_in_child=_GATE.reset)


class ObjectFile:
    """A seekable, read-only, Python-file-like view of one object of known size."""

    def __init__(self, storage: ObjectBackend, path: str, size: int,
                 prefetched: PrefetchedFile | None = None) -> None:
        self._storage = storage
        self._path = path
        self._size = size
        self._prefetched = prefetched
        self._pos = 0
        self._lock = threading.Lock()
        self.closed = False
        self.mode = "rb"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self._pos = offset
        elif whence == 1:
            self._pos += offset
        else:
            self._pos = self._size + offset
        return self._pos

    def read(self, nbytes: int = -1) -> Any:
        start = self._pos
        end = self._size if nbytes is None or nbytes < 0 else min(self._size, start + nbytes)
        self._pos = max(start, end)
        if end <= start:
            return b""
        return self._read(start, end)

    def read_at(self, nbytes: int, offset: int) -> Any:
        return self._read(offset, min(self._size, offset + nbytes))

    def _read(self, start: int, end: int) -> Any:
        _GATE.enter(self._path)
        try:
            return self._read_inside(start, end)
        finally:
            _GATE.leave()

    def _read_inside(self, start: int, end: int) -> Any:
        pre = self._prefetched
        if pre is not None:
            data = pre.read(start, end)
            if data is not None:
                return data
            holes = pre.holes(start, end)
            if not holes:  # covered, but by several buffers: join them
                return self._join(pre, start, end)
        return self._storage.read_range(self._path, start, end)

    def _join(self, pre: PrefetchedFile, start: int, end: int) -> bytes:
        out = bytearray()
        pos = start
        while pos < end:
            i = bisect.bisect_right(pre.starts, pos) - 1
            s, buf = pre.starts[i], pre.buffers[i]
            take = min(end, s + len(buf))
            out += memoryview(buf)[pos - s:take - s]
            pos = take
        return bytes(out)

    def close(self) -> None:
        self.closed = True


class ObjectFileSystemHandler(pafs.FileSystemHandler):
    """pyarrow filesystem calls on one bucket; paths are object keys.

    ``sizes`` and ``prefetched`` (by key) come from the metastore and a reader's prefetch, so
    opening a file costs no request.
    """

    def __init__(self, storage: ObjectBackend, sizes: dict[str, int] | None = None,
                 prefetched: dict[str, PrefetchedFile] | None = None) -> None:
        self.storage = storage
        self.sizes = sizes or {}
        self.prefetched = prefetched or {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectFileSystemHandler, (self.storage, self.sizes))

    def get_type_name(self) -> str:
        return "arrowlake-object-store"

    def equals(self, other: Any) -> bool:
        return isinstance(other, ObjectFileSystemHandler) and other is self

    def normalize_path(self, path: str) -> str:
        return path

    def _open(self, path: str) -> pa.NativeFile:
        _GATE.enter(path)
        try:
            return self._open_inside(path)
        finally:
            _GATE.leave()

    def _open_inside(self, path: str) -> pa.NativeFile:
        pre = self.prefetched.get(path)
        url = self.storage.url(path)
        size = pre.size if pre is not None else self.sizes.get(path)
        if size is None:
            size = self.storage.size(url)
        return pa.PythonFile(ObjectFile(self.storage, url, size, pre), mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._open(path)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._open(path)

    def get_file_info(self, paths: Sequence[str]) -> list[pafs.FileInfo]:
        out = []
        for p in paths:
            size = self.prefetched[p].size if p in self.prefetched else self.sizes.get(p)
            if size is None:
                try:
                    size = self.storage.size(self.storage.url(p))
                except StorageError:
                    out.append(pafs.FileInfo(p, pafs.FileType.NotFound))
                    continue
            out.append(pafs.FileInfo(p, pafs.FileType.File, size=size))
        return out

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = self.storage.url(selector.base_dir.strip("/"))
        return [pafs.FileInfo(self.storage.key(f.path), pafs.FileType.File, size=f.size)
                for f in self.storage.list_files(base)]

    def open_output_stream(self, path: str, metadata: Any = None) -> pa.NativeFile:
        return self.storage.open_output(self.storage.url(path))

    def delete_file(self, path: str) -> None:
        self.storage.delete([self.storage.url(path)])

    def create_dir(self, path: str, recursive: bool) -> None:
        pass  # object stores have no directories

    def _unsupported(self, *args: Any, **kwargs: Any) -> None:
        # pyarrow only reads files and writes whole new ones through this filesystem.
        raise StorageError(
            "arrowlake's object-store filesystem reads files and writes new ones only: moving, "
            "copying, appending and deleting directories are not offered")

    delete_dir = delete_dir_contents = delete_root_dir_contents = _unsupported
    move = copy_file = open_append_stream = _unsupported
