"""PyTorch: scans (and streams) as ``IterableDataset`` s for a ``DataLoader``.

>>> ds = events.scan(columns=["x", "y"]).to_torch(batch_size=4096, shuffle_buffer=100_000,
...                                               seed=7)  # doctest: +SKIP
>>> loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4)  # doctest: +SKIP

The dataset yields whole batches (so the DataLoader is given ``batch_size=None``): a dict of
tensors, one per column, or Arrow record batches with ``output="arrow"``.

Sharing out: the splits are ordered (shuffled per epoch from ``seed`` and the epoch number,
the same order in every process), then dealt out to the ``world_size * num_workers`` readers
(every DataLoader worker of every distributed rank) by size, so each reads a disjoint share and
together they read every row once per epoch. The rank and world size come from
``torch.distributed`` when it is initialised, or are given.

Epochs: call :meth:`set_epoch` at the start of each epoch (as with ``DistributedSampler``):
then each epoch's order depends only on ``seed`` and the epoch, and is reproducible. Without
it, every iteration still gets a new order (from the DataLoader's per-epoch base seed, so
reproducible only when torch's RNG is seeded too); with several ranks, whose DataLoaders draw
different base seeds, only ``set_epoch`` reshuffles between epochs. Without ``seed``, one is
drawn when the dataset is made (several ranks must pass the same ``seed``).

Each reader opens its next two splits on threads while it hands out one's batches.
Rows are shuffled within each reader's share with a buffer of ``shuffle_buffer`` rows (0: rows
keep the order of their split). Iterated in-process, tensors share Arrow's memory where Arrow
allows it (numeric columns without nulls, in one chunk); do not modify them in place. In
DataLoader workers each batch is written once into shared memory, which torch hands over to
the main process without copying it again (:func:`shared_tensors`); every batch costs one
hand-over, so large batches move rows fastest.

Streams (``Stream.to_torch()``, :func:`stream_dataset`): split ``i`` of the change of snapshot
``s`` goes to reader ``(s + i) % readers`` (see :class:`StreamSplits`), and each reader hands
over what it holds when the stream catches up.

``torch`` is imported only when a dataset is made (the ``torch`` extra).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from arrowlake.errors import ValidationError, require
from arrowlake.scan.adapters import register_adapter
from arrowlake.scan.scan import Scan

__all__ = ["OUTPUTS", "Dealt", "SplitDataset", "StreamSplits", "dataset", "scan_dataset",
           "shared_tensors", "stream_dataset", "to_tensors"]

OUTPUTS = ("torch", "arrow")


class _CaughtUp:
    """What a source of splits yields when it has nothing more for now (a stream that caught
    up): readers then hand over the rows they hold instead of waiting to fill a batch."""

    def __repr__(self) -> str:
        return "CAUGHT_UP"


CAUGHT_UP = _CaughtUp()


class SplitLike(Protocol):
    """What the datasets read: a picklable part of a scan or a change."""

    def to_batches(self) -> Iterator[pa.RecordBatch]: ...

    @property
    def row_count(self) -> int: ...


@dataclass(frozen=True)
class Dealt:
    """A split of an unbounded source with the key it is dealt by: reader ``key % readers``
    reads it. Every reader's copy of the source must give each split the same key."""

    key: int
    split: SplitLike


#: The splits of an epoch, or a function giving them as they come (with :data:`CAUGHT_UP`;
#: splits given as :class:`Dealt` go to the reader their key names, others round-robin).
Source = Sequence[SplitLike] | Callable[[], Iterable["SplitLike | Dealt | _CaughtUp"]]


# -- converting batches ---------------------------------------------------------------------------


def _tensor_kind(t: pa.DataType) -> str | None:
    """How a column of type ``t`` becomes a tensor, or None when it cannot."""
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_duration(t) \
            or pa.types.is_time(t):
        return "temporal"  # as int64/int32 counts of the type's unit
    if pa.types.is_fixed_size_list(t) and _tensor_kind(t.value_type) in ("number", "bool"):
        return "fixed_list"  # one row of a 2-D tensor per value, e.g. embeddings
    return None


def check_tensor_columns(schema: pa.Schema) -> None:
    """Refuse, before reading, columns that have no tensor form."""
    bad = [f"{f.name} ({f.type})" for f in schema if _tensor_kind(f.type) is None]
    if bad:
        raise ValidationError(
            f"Columns {', '.join(bad)} cannot become tensors (only integer, floating, boolean, "
            "temporal and fixed-size-list-of-number columns can): choose columns= without "
            "them, or use output='arrow'")


def _numpy(array: pa.Array, name: str) -> np.ndarray:
    kind = _tensor_kind(array.type)
    if kind == "temporal":
        width = pa.int64() if array.type.bit_width == 64 else pa.int32()
        array = array.view(width)
        kind = "number"
    if kind == "fixed_list":
        width = array.type.list_size
        if array.null_count:
            raise ValidationError(f"Column '{name}' holds null lists; a tensor cannot: filter "
                                  "them out or use output='arrow'")
        values = _numpy(array.flatten(), name)
        return values.reshape(len(array), width)
    if array.null_count:
        if pa.types.is_floating(array.type):
            return array.to_numpy(zero_copy_only=False)  # nulls become NaN
        raise ValidationError(
            f"Column '{name}' ({array.type}) holds nulls, which an integer or boolean tensor "
            f"cannot: filter them out (e.g. filter=\"{name} is not null\"), or use "
            "output='arrow'")
    return array.to_numpy(zero_copy_only=False)  # zero-copy unless boolean


def to_tensors(batch: pa.RecordBatch) -> dict[str, Any]:
    """A record batch as a dict of tensors, sharing Arrow's buffers where it can."""
    torch = require("torch", "torch", "to_torch()")
    out = {}
    with warnings.catch_warnings():
        # Arrow's buffers are read-only; torch warns once that the tensor is not writable.
        warnings.simplefilter("ignore", UserWarning)
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            out[name] = torch.from_numpy(_numpy(column, name))
    return out


_ALIGN = 64  # each column's offset in a shared block: aligned for any element type


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    return [c for c in chunks if len(c)]


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):  # a write may be short (very large columns)
        done += os.pwrite(fd, data[done:], offset + done)


def shared_tensors(batch: pa.Table | pa.RecordBatch) -> dict[str, Any] | None:
    """The batch as a dict of tensors in one block of shared memory, or None where that cannot
    be made (no ``memfd_create``, an older torch, a sharing strategy other than torch's default
    ``file_descriptor``, no rows, out of descriptors): then use :func:`to_tensors`.

    For DataLoader workers. A tensor a worker hands over must be in shared memory: torch copies
    any other into a new shared block, one per column, as it is sent, and the kernel then
    faults in and zeroes every page of it one by one. Here each column's chunks are written
    into an anonymous shared-memory file once (a plain write, without page faults, and
    without first joining the chunks on the heap), all columns in one file, and the tensors are
    views of it: torch sends its descriptor to the main process, nothing is copied again, and
    the memory is freed when the last tensor of the batch is dropped there.
    """
    torch = require("torch", "torch", "to_torch()")
    new_shared = getattr(torch.UntypedStorage, "_new_shared_fd_cpu", None)
    if new_shared is None or not hasattr(os, "memfd_create") or not batch.num_rows \
            or torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return None
    layout = []  # (name, numpy chunks, dtype, row shape, offset)
    size = 0
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        arrays = [np.ascontiguousarray(_numpy(c, name)) for c in _chunks(column)]
        layout.append((name, arrays, arrays[0].dtype, arrays[0].shape[1:], size))
        size += -(-sum(a.nbytes for a in arrays) // _ALIGN) * _ALIGN
    try:
        fd = os.memfd_create("arrowlake-batch", os.MFD_CLOEXEC)
    except OSError:
        return None
    try:
        os.ftruncate(fd, size)
        for _, arrays, _, _, offset in layout:
            for array in arrays:
                _write_all(fd, array.reshape(-1).view(np.uint8).data, offset)
                offset += array.nbytes
        storage = new_shared(fd, size)  # maps the file and keeps its own descriptor
    except OSError:
        return None
    finally:
        os.close(fd)
    out = {}
    for name, _, dtype, row_shape, offset in layout:
        kind = torch.from_numpy(np.empty(0, dtype)).dtype
        shape = (batch.num_rows, *row_shape)
        out[name] = torch.empty(0, dtype=kind).set_(storage, offset // dtype.itemsize, shape)
    return out


# -- batching and shuffling (vectorized: tables are sliced and taken, never walked by row) -------


def rebatch(tables: Iterable[pa.Table | pa.RecordBatch | _CaughtUp], schema: pa.Schema,
            batch_size: int, drop_last: bool) -> Iterator[pa.RecordBatch]:
    """Batches of exactly ``batch_size`` rows (the last one shorter unless ``drop_last``); at
    :data:`CAUGHT_UP` the rows held so far leave as a shorter batch (unless ``drop_last``)."""
    return (_one_batch(t) for t in _rebatched(tables, schema, batch_size, drop_last))


def _rebatched(tables: Iterable[pa.Table | pa.RecordBatch | _CaughtUp], schema: pa.Schema,
               batch_size: int, drop_last: bool) -> Iterator[pa.Table]:
    """:func:`rebatch`'s batches as tables that may hold several chunks (not yet copied into
    one: a batch bound for shared memory is copied there once, chunk by chunk)."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for part in tables:
        if isinstance(part, _CaughtUp):
            if rows and not drop_last:
                yield pa.Table.from_batches(pending, schema)
                pending, rows = [], 0
            continue
        if not part.num_rows:
            continue
        pending.extend(part.to_batches() if isinstance(part, pa.Table) else [part])
        rows += part.num_rows
        if rows < batch_size:
            continue
        table = pa.Table.from_batches(pending, schema)
        start = 0
        while rows - start >= batch_size:
            yield table.slice(start, batch_size)
            start += batch_size
        pending = table.slice(start).to_batches()
        rows -= start
    if rows and not drop_last:
        yield pa.Table.from_batches(pending, schema)


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()  # copies only when rows span chunks
    return batches[0] if batches else pa.RecordBatch.from_pylist([], table.schema)


def shuffled(batches: Iterable[pa.RecordBatch | _CaughtUp], schema: pa.Schema,
             buffer_rows: int, rng: np.random.Generator) -> Iterator[pa.Table | _CaughtUp]:
    """The rows of ``batches`` shuffled through a buffer of about ``buffer_rows`` rows.

    When the buffer is full its rows are permuted; half of them leave, half wait to be mixed
    with what comes next (each row is copied about twice).
    """
    pending: list[pa.RecordBatch] = []
    rows = 0
    keep = buffer_rows // 2
    for batch in batches:
        if isinstance(batch, _CaughtUp):  # hand over the whole buffer, shuffled
            if rows:
                table = pa.Table.from_batches(pending, schema)
                yield table.take(pa.array(rng.permutation(rows)))
                pending, rows = [], 0
            yield batch
            continue
        pending.append(batch)
        rows += batch.num_rows
        if rows < buffer_rows:
            continue
        table = pa.Table.from_batches(pending, schema)
        order = pa.array(rng.permutation(rows))
        yield table.take(order[keep:])
        rest = table.take(order[:keep])
        pending, rows = rest.to_batches(), keep
    if rows:
        table = pa.Table.from_batches(pending, schema)
        yield table.take(pa.array(rng.permutation(rows)))


# -- sharing out splits ---------------------------------------------------------------------------


def deal(sizes: Sequence[int], readers: int) -> list[list[int]]:
    """The indices of ``sizes`` dealt to ``readers`` in order, each to the least-loaded reader
    so far (ties: the lowest reader): disjoint shares, together all of them."""
    loads = np.zeros(readers, dtype=np.int64)
    shares: list[list[int]] = [[] for _ in range(readers)]
    for index, size in enumerate(sizes):  # one step per split, not per row
        reader = int(np.argmin(loads))
        shares[reader].append(index)
        loads[reader] += max(int(size), 1)
    return shares


def _whole(value: Any) -> bool:
    """Whether ``value`` is a whole number (NaN, floats and booleans are not)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@dataclass
class SplitDataset:
    """The reading logic of the datasets, free of torch so that it pickles by reference.

    ``source`` gives the splits of one epoch (for a scan: its planned splits; for a stream: a
    function giving the splits of its changes as they arrive, and :data:`CAUGHT_UP` whenever
    it has nothing more for now).
    """

    source: Source
    schema: pa.Schema
    batch_size: int = 1024
    shuffle_buffer: int = 0
    seed: int | None = None
    shuffle: bool = True
    drop_last: bool = False
    output: str = "torch"
    rank: int = 0
    world_size: int = 1
    epoch: int = 0
    _epoch_set: bool = field(default=False, repr=False)
    _iterations: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ValidationError(f"output must be one of {OUTPUTS}, got {self.output!r}")
        if not _whole(self.batch_size) or self.batch_size < 1:
            raise ValidationError(f"batch_size must be 1 or more, got {self.batch_size!r}")
        if not _whole(self.shuffle_buffer) or self.shuffle_buffer < 0:
            raise ValidationError(
                f"shuffle_buffer must be 0 or more, got {self.shuffle_buffer!r}")
        if not (_whole(self.rank) and _whole(self.world_size)) or self.world_size < 1 \
                or not 0 <= self.rank < self.world_size:
            raise ValidationError(f"rank must be in [0, world_size): got rank={self.rank}, "
                                  f"world_size={self.world_size}")
        if self.seed is None:
            if self.world_size > 1 and (self.shuffle or self.shuffle_buffer):
                raise ValidationError(
                    "With several ranks, pass seed= (the same on every rank): the ranks must "
                    "agree on each epoch's order of splits to share them out")
            self.seed = int(np.random.default_rng().integers(2**62))
        if self.output == "torch":
            check_tensor_columns(self.schema)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order of splits from the next iteration on."""
        self.epoch = int(epoch)
        self._epoch_set = True

    def _this_epoch(self, loader_seed: int | None) -> tuple[int, ...]:
        """What this iteration's order of splits is drawn from, besides ``seed``.

        After :meth:`set_epoch`: the epoch. Otherwise the iterations of this copy of the
        dataset are counted (a dataset iterated in one process, or by persistent workers), and
        in DataLoader workers of a single rank the DataLoader's base seed, which it draws anew
        for every epoch and which all its workers share, is mixed in: epochs differ even when
        the workers are new processes each epoch (reproducible when torch's RNG is seeded).
        """
        if self._epoch_set:
            return (self.epoch,)
        iteration = self._iterations
        self._iterations += 1
        if loader_seed is not None and self.world_size == 1:
            return (self.epoch + iteration, loader_seed)
        return (self.epoch + iteration,)

    def _reader(self, worker: int, workers: int) -> tuple[int, int]:
        return self.rank * workers + worker, self.world_size * workers

    def splits_of(self, reader: int, readers: int, epoch: tuple[int, ...]
                  ) -> Iterator[SplitLike | _CaughtUp]:
        """The splits reader ``reader`` of ``readers`` reads in ``epoch``."""
        if callable(self.source):
            # An unbounded sequence (a stream): a split with a key goes to reader key mod
            # readers, the k-th one without to reader k mod readers; every reader learns when
            # the source caught up.
            k = 0
            for split in self.source():
                if isinstance(split, _CaughtUp):
                    yield split
                    continue
                if isinstance(split, Dealt):
                    if split.key % readers == reader:
                        yield split.split
                    continue
                if k % readers == reader:
                    yield split
                k += 1
            return
        splits = list(self.source)
        order = np.arange(len(splits))
        if self.shuffle:
            order = np.random.default_rng([self.seed or 0, *epoch]).permutation(len(splits))
        shares = deal([splits[i].row_count for i in order], readers)
        for i in shares[reader]:
            yield splits[int(order[i])]

    def batches(self, worker: int = 0, workers: int = 1, loader_seed: int | None = None
                ) -> Iterator[pa.RecordBatch]:
        """This worker's batches of the next epoch, as Arrow record batches."""
        return (_one_batch(t) for t in self._tables(worker, workers, loader_seed))

    def _tables(self, worker: int, workers: int, loader_seed: int | None
                ) -> Iterator[pa.Table]:
        epoch = self._this_epoch(loader_seed)
        reader, readers = self._reader(worker, workers)
        parts: Iterable[pa.RecordBatch | pa.Table | _CaughtUp] = _read(
            self.splits_of(reader, readers, epoch))
        if self.shuffle_buffer:
            rng = np.random.default_rng([self.seed or 0, *epoch, reader, 1])
            parts = shuffled(parts, self.schema, self.shuffle_buffer, rng)
        return _rebatched(parts, self.schema, self.batch_size, self.drop_last)

    def items(self, worker: int = 0, workers: int = 1, loader_seed: int | None = None,
              shared: bool = False) -> Iterator[Any]:
        """The next epoch's items; ``shared``: tensors in shared memory (a DataLoader worker
        hands them over to the main process that way without copying them again)."""
        tables = self._tables(worker, workers, loader_seed)
        if self.output == "arrow":
            return (_one_batch(t) for t in tables)
        if shared:
            return (_shared_or_not(t) for t in tables)
        return (to_tensors(_one_batch(t)) for t in tables)


def _shared_or_not(table: pa.Table) -> dict[str, Any]:
    tensors = shared_tensors(table)
    return tensors if tensors is not None else to_tensors(_one_batch(table))


def _opened(split: SplitLike) -> tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]]:
    """The split's first batch (None if it has none) and the iterator of the rest."""
    batches = iter(split.to_batches())
    return next(batches, None), batches


#: Splits a reader opens ahead of the one it hands out.
_AHEAD = 2


def _read(splits: Iterable[SplitLike | _CaughtUp]) -> Iterator[pa.RecordBatch | _CaughtUp]:
    """The batches of ``splits`` in order, the next :data:`_AHEAD` splits opened on threads
    while one is handed out.

    Opening a split (planning its scan, reading its files' first pages, decoding its first
    batch) is a wait in which this thread does nothing, and by then the split's other batches
    are mostly decoded: read one split after another, the reader would wait at every split,
    with the cores idle while a split's scan starts and ends. Opened ahead, the splits'
    scans overlap as one dataset's files do. Memory holds the read-ahead of ``_AHEAD + 1``
    splits' scans. The source of splits is iterated on this thread only, and never past
    :data:`CAUGHT_UP` before everything before it was handed out (a stream's source blocks
    after it until more changes come). A failure to read a split is raised in order, once
    the splits before it were handed out.
    """
    source = iter(splits)
    pool: ThreadPoolExecutor | None = None
    pending: deque[Future[tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]]]
                   | _CaughtUp] = deque()
    exhausted = False
    try:
        while True:
            while not exhausted and len(pending) <= _AHEAD \
                    and not (pending and isinstance(pending[-1], _CaughtUp)):
                item = next(source, None)
                if item is None:
                    exhausted = True
                elif isinstance(item, _CaughtUp):
                    pending.append(item)
                else:
                    if pool is None:
                        pool = ThreadPoolExecutor(_AHEAD,
                                                  thread_name_prefix="arrowlake-torch-read")
                    pending.append(pool.submit(_opened, item))
            if not pending:
                return
            head = pending.popleft()
            if isinstance(head, _CaughtUp):
                yield head
                continue
            first, rest = head.result()
            if first is not None:
                yield first
                yield from rest
    finally:
        for opening in pending:
            if isinstance(opening, Future):
                opening.cancel()
        if pool is not None:
            pool.shutdown(wait=True)


_dataset_class: type | None = None


def _torch_dataset_class() -> type:
    """``TorchDataset``: defined on first use, once torch is imported."""
    global _dataset_class
    if _dataset_class is not None:
        return _dataset_class
    torch = require("torch", "torch", "to_torch()")

    class TorchDataset(torch.utils.data.IterableDataset):  # type: ignore[name-defined]
        """An ``IterableDataset`` over a :class:`SplitDataset` (see the module docs)."""

        def __init__(self, reading: SplitDataset) -> None:
            super().__init__()
            self.reading = reading

        def set_epoch(self, epoch: int) -> None:
            self.reading.set_epoch(epoch)

        def close(self) -> None:
            """Stop following a stream: the DataLoader's workers (and any thread of this
            process iterating the dataset) end their iteration, and the stream is closed."""
            close = getattr(self.reading.source, "close", None)
            if close is not None:
                close()

        @property
        def schema(self) -> pa.Schema:
            return self.reading.schema

        def __iter__(self) -> Iterator[Any]:
            info = torch.utils.data.get_worker_info()
            if info is None:
                return self.reading.items()
            # Every worker's seed is the DataLoader's base seed (new each epoch) plus its id.
            return self.reading.items(info.id, info.num_workers, info.seed - info.id,
                                      shared=True)

        def __reduce__(self) -> tuple[Any, ...]:
            return (_rebuild, (self.reading,))

    TorchDataset.__module__ = __name__
    TorchDataset.__qualname__ = "TorchDataset"
    _dataset_class = TorchDataset
    return TorchDataset


def _rebuild(reading: SplitDataset) -> Any:
    return _torch_dataset_class()(reading)


def _distributed() -> tuple[int, int]:
    torch = require("torch", "torch", "to_torch()")
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


def dataset(source: Source,
            schema: pa.Schema, *, batch_size: int = 1024, shuffle_buffer: int = 0,
            seed: int | None = None, shuffle: bool = True, drop_last: bool = False,
            output: str = "torch", rank: int | None = None, world_size: int | None = None
            ) -> Any:
    """A ``torch.utils.data.IterableDataset`` over splits (see the module docs).

    ``source``: the splits of an epoch, or a function giving them as they come (a stream).
    ``batch_size``: rows per item; ``drop_last`` drops each reader's last, shorter batch.
    ``shuffle``: shuffle the order of splits every epoch. ``shuffle_buffer``: rows to shuffle
    through (0: none). ``output``: ``"torch"`` (dict of tensors) or ``"arrow"`` (record
    batches). ``rank``/``world_size``: this process's place among distributed ranks (default:
    ``torch.distributed``'s, else 0 of 1).
    """
    require("torch", "torch", "to_torch()")
    if (rank is None) != (world_size is None):
        raise ValidationError("Give both rank= and world_size=, or neither")
    if rank is None or world_size is None:
        rank, world_size = _distributed()
    reading = SplitDataset(source, schema, batch_size=batch_size, shuffle_buffer=shuffle_buffer,
                           seed=seed, shuffle=shuffle, drop_last=drop_last, output=output,
                           rank=rank, world_size=world_size)
    return _torch_dataset_class()(reading)


def scan_dataset(scan: Scan, *, split_bytes: int | None = None, **options: Any) -> Any:
    """:meth:`Scan.to_torch`: the scan's splits as a dataset."""
    require("torch", "torch", "Scan.to_torch()")
    if scan.limit is not None:
        raise ValidationError("Scan.to_torch() cannot share out a scan with a limit; read "
                              "it with to_arrow(), or drop the limit")
    if options.get("output", "torch") == "torch":
        check_tensor_columns(scan.schema)
    return dataset(scan.plan(split_bytes), scan.schema, **options)


class StreamSplits:
    """The splits of a stream's changes as they come: the source of :meth:`Stream.to_torch`.

    Every DataLoader worker iterates its own copy of the stream (forked, or unpickled), from
    the same position with the same options. Copies read one change per snapshot (no
    catch-up, which would cut the history differently in copies that poll at different
    times), and a snapshot's change is planned from that snapshot alone, so every copy sees
    the same splits of the same changes. Split i of the change of snapshot s goes to reader
    ``(s + i) % readers``: a pure function of the split, whatever each copy saw before. Copies
    do not read changes ahead (each reads only its share) and never commit a consumer's
    progress.

    Iteration ends at :meth:`close`, when the stream is closed, and when the interpreter of
    the process that made this source exits (its main thread ended): the threads iterating it
    (a reader thread per rank, say) then end instead of following the stream forever and
    keeping the process alive.
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        # Shared with the DataLoader's worker processes: set by close() in any of them.
        self.stopped = multiprocessing.Event()
        self._pid = os.getpid()
        _follow(self)

    def close(self) -> None:
        """End the iteration of every copy (the workers' too) at once, and close the stream
        (in this process): every thread it started ends."""
        self.stopped.set()
        if os.getpid() == self._pid:
            self.stream.close()

    def _at_exit(self) -> None:
        if os.getpid() == self._pid:  # never from a worker: the event is shared with all
            self.stopped.set()

    def __call__(self) -> Iterator[Dealt | _CaughtUp]:
        stream = self.stream
        # No read-ahead (it would read every other worker's share too), and none of the
        # threads of the process the copy came from.
        stream._worker_copy()
        while not self.stopped.is_set():
            change = stream.poll()
            if change is None:
                if stream.stop_at_latest or stream.closed:
                    return
                yield CAUGHT_UP  # readers hand over the rows they hold, then wait
                while change is None and not stream.closed \
                        and not self.stopped.wait(stream.poll_interval):
                    change = stream.poll()
                if change is None:
                    return
            for index, split in enumerate(change.splits):
                yield Dealt(change.snapshot_id + index, split)


#: The stream sources of this process that may still be iterated, stopped at interpreter exit.
_FOLLOWING: weakref.WeakSet[StreamSplits] = weakref.WeakSet()
_FOLLOWING_LOCK = threading.Lock()
_exit_hook: list[bool] = []


def _follow(source: StreamSplits) -> None:
    """Stop ``source`` when the interpreter exits: before it waits for the threads still
    running (``threading``'s exit hooks run first), so a thread following a stream ends."""
    with _FOLLOWING_LOCK:
        _FOLLOWING.add(source)
        if not _exit_hook:
            # The hook concurrent.futures uses to stop its workers; absent or refused
            # (interpreter already exiting), streams end at close() only.
            register = getattr(threading, "_register_atexit", None)
            if register is not None:
                with contextlib.suppress(RuntimeError):
                    register(_stop_following)
            _exit_hook.append(True)


def _stop_following() -> None:
    with _FOLLOWING_LOCK:
        sources = list(_FOLLOWING)
    for source in sources:
        source._at_exit()


def stream_dataset(stream: Any, **options: Any) -> Any:
    """:meth:`Stream.to_torch`: the stream's changes, split by split, as a dataset that never
    ends (unless the stream was opened with ``stop_at_latest=True``). Splits are shared out in
    the order they come (``shuffle`` and ``set_epoch`` do not apply); ``shuffle_buffer`` still
    mixes rows, and a batch may hold rows of several changes; when the stream has caught up,
    each worker hands over the rows it holds as a shorter batch (unless ``drop_last``), so
    rows do not wait for later commits to fill a batch. DataLoader workers must be forked
    (the Linux default): a stream holds database connections and cannot be pickled.
    """
    require("torch", "torch", "Stream.to_torch()")
    options["shuffle"] = False
    return dataset(StreamSplits(stream), stream.schema, **options)


def __getattr__(name: str) -> Any:
    if name == "TorchDataset":  # the class, for isinstance checks and pickling by name
        return _torch_dataset_class()
    raise AttributeError(name)


register_adapter("torch.scan", scan_dataset)
register_adapter("torch.stream", stream_dataset)
