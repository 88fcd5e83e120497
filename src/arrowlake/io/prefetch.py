"""Parquet from high-latency storage: fetched concurrently, ahead, and only what is read.

For each window of files a reader is about to decode:

1. the footer of every file is fetched with one request for its last ``FOOTER_GUESS`` bytes
   (small files arrive whole), concurrently, or taken from an LRU cache of footers;
2. pyarrow prunes row groups by their statistics against the pushed-down filter;
3. the byte ranges of the projected column chunks of the remaining row groups are coalesced
   (gaps under ``COALESCE_BYTES`` are read through) and fetched concurrently;
4. pyarrow decodes from those buffers, through a filesystem that serves them
   (:class:`arrowlake.io.object_files.ObjectFileSystemHandler`).

The next window is fetched while the current one is decoded. All requests run on one background
asyncio loop, at most ``storage.max_in_flight`` at a time per reader.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from arrowlake.errors import StorageError
from arrowlake.io.object_files import ObjectFileSystemHandler, PrefetchedFile
from arrowlake.io.object_store import ObjectStorage
from arrowlake.io.storage import Storage

#: Bytes fetched from the end of a file to get its footer in one request (most fit). It is
#: pyarrow's footer read size, so pyarrow's own footer read is served from memory.
FOOTER_GUESS = 64 * 1024
#: Column chunks closer than this are fetched in one request (a request costs more than this).
COALESCE_BYTES = 256 * 1024
#: A window holds at most this many bytes of files (their full sizes) ...
WINDOW_BYTES = 256 * 1024 * 1024
#: ... and at most this many files.
WINDOW_FILES = 256

T = TypeVar("T")


@dataclass(frozen=True)
class FileRef:
    path: str  # absolute location
    size: int


# -- the background loop ---------------------------------------------------------------------

_LOOP_LOCK = threading.Lock()
_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None


def _loop() -> asyncio.AbstractEventLoop:
    """The process's IO loop (restarted in a forked child, whose copy has no thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="arrowlake-io", daemon=True).start()
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


def submit(coro: Any) -> Future[Any]:
    return asyncio.run_coroutine_threadsafe(coro, _loop())


# -- footer cache ----------------------------------------------------------------------------


class FooterCache:
    """File tails holding the footer (the last ``FOOTER_GUESS`` bytes, or the footer if it is
    longer) by (path, size).

    Data files are immutable, so a path and size identify a footer forever. Bounded by bytes;
    pyarrow parses a cached footer in microseconds, so the bytes are what is kept — the whole
    tail, because pyarrow reads exactly that much to find the footer.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, int]) -> bytes | None:
        with self._lock:
            data = self._items.get(key)
            if data is None:
                self.misses += 1
                return None
            self.hits += 1
            self._items.move_to_end(key)
            return data

    def put(self, key: tuple[str, int], data: bytes) -> None:
        with self._lock:
            if key in self._items or len(data) > self.max_bytes:
                return
            self._items[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held)."""
        self._lock = threading.Lock()


FOOTERS = FooterCache()
os.register_at_fork(after_in_child=FOOTERS.after_fork)


# -- planning byte ranges --------------------------------------------------------------------


def coalesce(ranges: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Merge ranges that overlap or lie closer than ``gap`` bytes."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start - out[-1][1] <= gap:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def column_chunk_ranges(fragment: ds.ParquetFileFragment,
                        columns: Collection[str] | None) -> list[tuple[int, int]]:
    """Byte ranges of the chunks of top-level ``columns`` (None: all) in the fragment's
    row groups."""
    meta = fragment.metadata
    wanted = None if columns is None else set(columns)
    if wanted is not None and any("." in c for c in wanted):
        wanted = None  # a dotted name is ambiguous in chunk paths: read every column
    out = []
    for rg in fragment.row_groups:
        group = meta.row_group(rg.id)
        for i in range(group.num_columns):
            chunk = group.column(i)
            if wanted is not None and chunk.path_in_schema.split(".", 1)[0] not in wanted:
                continue
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                start = min(start, chunk.dictionary_page_offset)
            out.append((start, start + chunk.total_compressed_size))
    return out


# -- fetching --------------------------------------------------------------------------------


async def _limited(sem: asyncio.Semaphore, coro: Any) -> Any:
    async with sem:
        return await coro


async def _fetch_tail(storage: Storage, ref: FileRef, sem: asyncio.Semaphore) -> PrefetchedFile:
    pre = PrefetchedFile(ref.size)
    cached = FOOTERS.get((ref.path, ref.size))
    if cached is not None:
        pre.add(ref.size - len(cached), cached)
        return pre
    n = min(ref.size, FOOTER_GUESS)
    tail = await _limited(sem, storage.read_range_async(ref.path, ref.size - n, ref.size))
    if len(tail) < 8 or bytes(tail[-4:]) != b"PAR1":
        raise StorageError(f"{ref.path} is not a Parquet file (no PAR1 trailer)")
    footer = int.from_bytes(bytes(tail[-8:-4]), "little") + 8
    if footer > n:
        if footer > ref.size:
            raise StorageError(f"{ref.path} is corrupt: footer of {footer} bytes in a "
                               f"{ref.size}-byte file")
        head = await _limited(sem, storage.read_range_async(
            ref.path, ref.size - footer, ref.size - n))
        tail = bytes(head) + bytes(tail)
        n = footer
    pre.add(ref.size - n, tail)
    FOOTERS.put((ref.path, ref.size), bytes(tail))
    return pre


async def _fetch_ranges(storage: Storage, path: str, pre: PrefetchedFile,
                        ranges: list[tuple[int, int]], sem: asyncio.Semaphore) -> None:
    holes = []
    for start, end in ranges:
        holes.extend(pre.holes(start, end))
    if not holes:
        return
    parts = await asyncio.gather(*(
        _limited(sem, storage.read_range_async(path, s, e)) for s, e in holes))
    for (start, _), data in zip(holes, parts, strict=True):
        pre.add(start, data)


@dataclass
class Window:
    """Fragments ready to decode from memory, and the filesystem serving them."""

    fragments: list[ds.ParquetFileFragment]
    filesystem: pafs.FileSystem


async def _fetch_window(storage: Storage, refs: Sequence[FileRef], fmt: ds.ParquetFileFormat,
                        columns: Collection[str] | None, filter: pc.Expression | None,
                        schema: Any, sem: asyncio.Semaphore) -> Window:
    assert isinstance(storage, ObjectStorage)
    tails = await asyncio.gather(*(_fetch_tail(storage, r, sem) for r in refs))
    keys = [storage.key(r.path) for r in refs]
    prefetched = dict(zip(keys, tails, strict=True))
    fs = pafs.PyFileSystem(ObjectFileSystemHandler(storage, prefetched=prefetched))
    # Footer parsing and row-group pruning are pyarrow calls that read through `fs`: off the loop.
    planned = await asyncio.to_thread(_plan_fragments, fs, refs, keys, fmt, columns, filter,
                                      schema)
    await asyncio.gather(*(_fetch_ranges(storage, ref.path, prefetched[key], ranges, sem)
                           for ref, key, _, ranges in planned))
    return Window([fragment for _, _, fragment, _ in planned], fs)


def _plan_fragments(fs: pafs.FileSystem, refs: Sequence[FileRef], keys: Sequence[str],
                    fmt: ds.ParquetFileFormat, columns: Collection[str] | None,
                    filter: pc.Expression | None, schema: Any,
                    ) -> list[tuple[FileRef, str, ds.ParquetFileFragment, list[tuple[int, int]]]]:
    out = []
    for ref, key in zip(refs, keys, strict=True):
        fragment = fmt.make_fragment(key, fs, file_size=ref.size)
        fragment.ensure_complete_metadata()  # parses the footer from memory
        if filter is not None:
            fragment = fragment.subset(filter=filter, schema=schema)
            if not fragment.row_groups:
                continue
        ranges = coalesce(column_chunk_ranges(fragment, columns), COALESCE_BYTES)
        out.append((ref, key, fragment, ranges))
    return out


def windows(files: Sequence[FileRef], max_bytes: int | None = None,
            max_files: int | None = None) -> list[list[FileRef]]:
    max_bytes = WINDOW_BYTES if max_bytes is None else max_bytes
    max_files = WINDOW_FILES if max_files is None else max_files
    out: list[list[FileRef]] = []
    size = 0
    for ref in files:
        if not out or len(out[-1]) >= max_files or size + ref.size > max_bytes:
            out.append([])
            size = 0
        out[-1].append(ref)
        size += ref.size
    return out


def prefetched_windows(storage: Storage, files: Sequence[FileRef], fmt: ds.ParquetFileFormat, *,
                       columns: Collection[str] | None, filter: pc.Expression | None,
                       schema: Any, ahead: int = 1) -> Iterator[Window]:
    """Windows of the files, each fetched (``ahead`` windows in advance) before it is yielded.

    ``columns`` are the physical top-level columns read (None: all), ``filter`` the pushed-down
    predicate in the files' schema (prunes row groups), ``schema`` the files' schema.
    """
    groups = windows(files)
    if not groups:
        return
    loop = _loop()
    sem_future = asyncio.run_coroutine_threadsafe(_semaphore(storage.max_in_flight), loop)
    sem = sem_future.result()
    pending: list[Future[Window]] = []
    next_group = 0
    try:
        while next_group < len(groups) or pending:
            while next_group < len(groups) and len(pending) <= ahead:
                pending.append(submit(_fetch_window(storage, groups[next_group], fmt, columns,
                                                    filter, schema, sem)))
                next_group += 1
            yield pending.pop(0).result()
    finally:
        for fut in pending:
            fut.cancel()


async def _semaphore(n: int) -> asyncio.Semaphore:
    return asyncio.Semaphore(n)
