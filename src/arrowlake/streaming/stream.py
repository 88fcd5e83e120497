"""Change streams: every table read as a sequence of changes, one per snapshot.

A :class:`Stream` keeps a position (the last snapshot it planned). Each poll is one indexed
range query for the snapshots after it (:meth:`Metastore.snapshots_after`); each new snapshot
is planned into a :class:`Change` from the files it added and removed (two indexed queries),
as picklable splits read by the ordinary split reader. When the stream is behind, the files of
many queued snapshots are fetched with one range query and split per snapshot in Arrow.

Waiting for commits: commits in this process wake the stream at once
(:mod:`arrowlake.metastore.signals`); so do commits of any process, on PostgreSQL through
``LISTEN``/``NOTIFY``, on SQLite through a cheap check of the database's change counter every
10 ms (one thread per database file), after which the stream runs its full poll.
``poll_interval`` is the longest a stream goes without a full poll (polls start every
``poll_interval`` seconds, the poll's own time included): it bounds how long a commit can wait
to be seen if no signal arrives, and signals make the usual wait much shorter while costing a
full poll only when something was committed.

Consumers: with ``consumer="id"``, ``commit(snapshot_id)`` records in the metastore that the
consumer resumes after that snapshot; a stream opened later with the same id starts there. An
open stream holds its consumer id with a lease in the metastore
(:mod:`arrowlake.streaming.leases`): a second stream of the same id is refused while the first
is open, and a stream whose process died gives the id up at once on its own machine, elsewhere
when the lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import SnapshotNotFound, ValidationError
from arrowlake.expressions import (
    AlwaysTrue,
    Expr,
    and_all,
    conjuncts,
    may_match,
    parse_filter,
    referenced_columns,
    rename_columns,
    to_arrow,
    to_expression,
)
from arrowlake.io.deletion_vectors import VectorRef
from arrowlake.io.deletion_vectors import encode as dv_encode
from arrowlake.io.deletion_vectors import vector_of as dv_vector_of
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD
from arrowlake.metastore import signals
from arrowlake.metastore.records import epoch_ms
from arrowlake.metastore.store import check_name
from arrowlake.scan.adapters import adapter
from arrowlake.scan.planning import (
    TableView,
    file_schemas,
    file_stats,
    file_tasks,
    group_tasks,
    plan_files,
)
from arrowlake.scan.split import FileTask, MergeSpec, Split
from arrowlake.schema import field_id, find_field
from arrowlake.streaming import leases
from arrowlake.streaming.catchup import NetChangeSplit
from arrowlake.streaming.change import AnySplit, Change
from arrowlake.streaming.splits import ROW_KIND_FIELD, ChangeSplit, ReferencedChangeSplit
from arrowlake.streaming.vector_changes import VectorChangeSplit
from arrowlake.table.changelog_files import (
    AFTER_COLUMN,
    REFERENCING_SUMMARY,
    UNCHANGED,
    log_schema,
)
from arrowlake.table.table import Table, register_stream_factory

#: Snapshot kinds that never change rows (compaction rewrites runs, the rows stay).
_NO_CHANGE_KINDS = frozenset({"compact"})
#: Snapshots fetched per poll query.
_POLL_BATCH = 1000
#: The next change is read ahead (while the caller processes the current one) up to this many
#: rows; larger ones are only planned ahead.
_PREFETCH_ROWS = 2_000_000
#: Splits of a change hold up to this many bytes of files.
_SPLIT_BYTES = 128 * 1024 * 1024


#: When the stream is behind, the files of the next queued snapshots are fetched with one range
#: query for up to this many of their files (by the snapshots' recorded file counts).
_BATCH_FILES = 20_000

def _seconds(name: str, value: Any) -> float:
    """A number of seconds a stream can wait: finite, >= 0, at most what threads can wait."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) \
            or not 0 <= value <= threading.TIMEOUT_MAX:
        raise ValidationError(
            f"{name} must be a number of seconds from 0 to {threading.TIMEOUT_MAX:.0f}, got "
            f"{value!r}")
    return float(value)


@dataclass(frozen=True)
class _Snapshot:
    snapshot_id: int
    kind: str
    committed_at: int
    summary: dict[str, Any]
    files: int = 0  # files the snapshot added and removed, as its row records
    schema_id: int | None = None  # the table's schema when the snapshot was committed


def _by_snapshot(files: pa.Table, column: str, ids: Sequence[int]) -> list[pa.Table]:
    """``files`` split into one table per snapshot id of ``ids`` (ascending) by ``column``,
    file ids ascending within each; zero-copy slices of one sorted table."""
    if files.num_rows == 0:
        return [files] * len(ids)
    files = files.sort_by([(column, "ascending"), ("file_id", "ascending")])
    keys = files.column(column).to_numpy()
    wanted = np.asarray(ids, dtype=np.int64)
    starts = np.searchsorted(keys, wanted, side="left")
    ends = np.searchsorted(keys, wanted, side="right")
    return [files.slice(int(a), int(b - a)) for a, b in zip(starts, ends, strict=True)]


def _bucket_predicate(shard: tuple[int, int] | None, buckets: Iterable[int] | None,
                      bucket_filter: Callable[[int], bool] | None
                      ) -> Callable[[pa.Array], pa.Array] | None:
    """A vectorized ``bucket ids -> keep mask`` from the stream's sharding options."""
    given = sum(x is not None for x in (shard, buckets, bucket_filter))
    if given > 1:
        raise ValidationError("Give at most one of shard=, buckets= and bucket_filter=")
    if shard is not None:
        if (not isinstance(shard, tuple | list) or len(shard) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in shard)
                or not 0 <= shard[0] < shard[1]):
            raise ValidationError(
                f"shard must be (i, n) with 0 <= i < n, got {shard!r}; worker i of n reads "
                "buckets b with b % n == i")
        index, count = int(shard[0]), int(shard[1])
        return lambda ids: pc.equal(pc.remainder(ids, count), index)
    if buckets is not None:
        wanted = pa.array(sorted({int(b) for b in buckets}), pa.int64())
        return lambda ids: pc.is_in(ids, wanted)
    if bucket_filter is not None:
        chosen = bucket_filter

        def keep(ids: pa.Array) -> pa.Array:
            # One call per distinct bucket, not per file.
            distinct = pc.unique(ids)
            kept = pa.array([bool(chosen(int(b))) for b in distinct.to_pylist()], pa.bool_())
            return pc.is_in(ids, distinct.filter(kept))

        return keep
    return None


class Stream:
    """A table's changes, read with ``for``/``async for``; see :meth:`Table.stream`."""

    def __init__(self, table: Table, *, consumer: str | None = None,
                 start: str | int | datetime = "full", poll_interval: float = 1.0,
                 shard: tuple[int, int] | None = None, buckets: Iterable[int] | None = None,
                 bucket_filter: Callable[[int], bool] | None = None,
                 include_row_kind: bool = False, filter: Expr | str | None = None,
                 columns: Sequence[str] | None = None, stop_at_latest: bool = False,
                 catch_up_threshold: int | None = 10, prefetch: bool = True) -> None:
        table.refresh()
        self._table = table
        self._metastore = table._metastore
        self._record = table._record
        self._table_id = table._record.table_id
        if consumer is not None:
            check_name("consumer", consumer)
        self.consumer = consumer
        self.poll_interval = _seconds("poll_interval", poll_interval)
        if catch_up_threshold is not None and (
                isinstance(catch_up_threshold, bool) or not isinstance(catch_up_threshold, int)
                or catch_up_threshold < 1):
            raise ValidationError(
                f"catch_up_threshold must be a positive integer or None, got "
                f"{catch_up_threshold!r}")
        self.catch_up_threshold = catch_up_threshold
        self._keep_buckets = _bucket_predicate(shard, buckets, bucket_filter)
        self.include_row_kind = bool(include_row_kind)
        self.stop_at_latest = bool(stop_at_latest)
        self._schema = table.schema
        self._expr = to_expression(filter)
        if not isinstance(self._expr, AlwaysTrue):
            to_arrow(self._expr, self._schema)  # a bad filter fails now, not at the first read
        self._columns = tuple(self._schema.names) if columns is None else tuple(columns)
        for name in self._columns:
            find_field(self._schema, name)
        if len(set(self._columns)) != len(self._columns):
            raise ValidationError(f"Columns are repeated: {list(self._columns)}")
        out = pa.schema([self._schema.field(c) for c in self._columns])
        self.schema = out.append(ROW_KIND_FIELD) if self.include_row_kind else out
        self._merge: MergeSpec | None = table._merge_spec()
        self._queue: deque[_Snapshot] = deque()
        self._full_at: int | None = None
        # A consumer's stream holds its id (a read-only metastore cannot record progress, so
        # its streams need no lease), taken before the position it resumes at is read.
        self._lease: leases.Lease | None = None
        if consumer is not None and not self._metastore.read_only:
            self._lease = leases.Lease(self._metastore, self._table_id, consumer)
        try:
            self.position = self._resolve_start(start)
        except BaseException:
            if self._lease is not None:
                self._lease.release()
            raise
        # Released by close(), or when the stream is collected or the interpreter exits.
        self._release_lease = weakref.finalize(
            self, self._lease.release if self._lease is not None else _nothing)
        self._closed = False
        self._wake = threading.Event()
        self._async_wakers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        # Weakly referenced from the signal registry: a stream dropped without close() is
        # collected, and its finalizer releases the subscription and the listener.
        signal_ref = weakref.WeakMethod(self._signal)

        def wake() -> None:
            method = signal_ref()
            if method is not None:
                method()

        releases = [signals.subscribe(self._metastore.url, self._table_id, wake)]
        if self._metastore.dialect == "postgresql":
            releases.append(signals.listen(self._metastore.url, self._metastore.engine))
        elif self._metastore.dialect == "sqlite" and (
                self._metastore.database_file() is not None or self._metastore.read_only):
            releases.append(signals.watch(self._metastore.url, self._metastore.engine))
        self._release = weakref.finalize(self, _release_all, releases)
        self._release.atexit = False
        self._prefetch = prefetch
        self._pool: ThreadPoolExecutor | None = None
        self._prefetched: dict[int, Future[Any]] = {}
        # Files added and removed per queued snapshot, fetched ahead in one range query.
        self._changed: dict[int, tuple[pa.Table, pa.Table]] = {}
        self._changed_lock = threading.Lock()

    # -- start and progress ----------------------------------------------------------------

    def _resolve_start(self, start: str | int | datetime) -> int:
        """The position (last snapshot considered done) to start after; may set a full scan."""
        ms, tid = self._metastore, self._table_id
        if self.consumer is not None:
            resume = ms.consumer_next_snapshot(tid, self.consumer)
            if resume is not None:
                return resume - 1
        current = ms.current_snapshot_id(tid)
        if isinstance(start, bool) or not isinstance(start, str | int | datetime):
            raise ValidationError(
                f"start must be 'full', 'latest', 'earliest', a snapshot id or a datetime, "
                f"got {start!r}")
        if start == "full":
            if current is None:
                return 0
            self._full_at = current
            return current
        if start == "latest":
            return 0 if current is None else current
        if start == "earliest":
            earliest = ms.earliest_snapshot_id(tid)
            if earliest is None:
                return 0
            if ms.snapshot(tid, earliest)["parent_id"] is None:
                return earliest - 1  # the whole history is retained: replay it
            # Older snapshots expired: their changes are gone, the state they left is not.
            self._full_at = earliest
            return earliest
        if isinstance(start, datetime):
            at_ms = epoch_ms(start, "start")
            earliest = ms.earliest_snapshot_id(tid)
            if earliest is not None:
                first = ms.snapshot(tid, earliest)
                if first["parent_id"] is None and first["committed_at"] > at_ms:
                    return earliest - 1
            return ms.snapshot_as_of(tid, at_ms)
        if isinstance(start, int):
            ms.snapshot(tid, start)  # SnapshotNotFound when expired or never committed
            return start - 1
        raise ValidationError(
            f"start must be 'full', 'latest', 'earliest', a snapshot id or a datetime, got "
            f"{start!r}")

    def commit(self, snapshot_id: int | None = None) -> None:
        """Record that this consumer has processed everything up to ``snapshot_id`` (by default
        the last change yielded): a stream opened later with the same consumer id resumes with
        the snapshot after it. One metastore transaction.

        A snapshot this stream has not yielded yet is refused; one before the consumer's
        recorded progress changes nothing (progress never moves backwards). Refused with
        ConsumerInUse when another stream has taken over the consumer id.
        """
        if self.consumer is None:
            raise ValidationError(
                "This stream has no consumer id, so it has no progress to commit: open it "
                "with table.stream(consumer='name')")
        if self._full_at is not None:
            raise ValidationError(
                f"Consumer {self.consumer!r} of table {self._table.name} has not yielded its "
                f"first change yet (the full state at snapshot {self._full_at}): commit once "
                "it is processed")
        if snapshot_id is None:
            snapshot_id = self.position
        if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int) or snapshot_id < 0:
            raise ValidationError(f"snapshot_id must be a snapshot id, got {snapshot_id!r}")
        if snapshot_id > self.position:
            raise ValidationError(
                f"Consumer {self.consumer!r} of table {self._table.name} cannot commit snapshot "
                f"{snapshot_id}: the stream has yielded changes up to snapshot {self.position} "
                "only, and a restart would skip the changes in between. Commit the "
                "snapshot_id of a change once it is processed")
        if self._lease is not None:
            self._lease.commit(snapshot_id + 1)
        else:
            self._metastore.commit_consumer(self._table_id, self.consumer, snapshot_id + 1)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the stream: iteration ends (a waiting ``for`` wakes up and finishes)."""
        if self._closed:
            return
        self._closed = True
        self._release()
        self._release_lease()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._signal()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        who = f" consumer={self.consumer!r}" if self.consumer else ""
        return f"<arrowlake.Stream {self._table.name}{who} position={self.position}>"

    def _signal(self) -> None:
        self._wake.set()
        with self._lock:
            wakers = list(self._async_wakers)
        for wake in wakers:
            wake()

    # -- engines -----------------------------------------------------------------------------

    def to_torch(self, *, batch_size: int = 1024, shuffle_buffer: int = 0,
                 seed: int | None = None, drop_last: bool = False, output: str = "torch",
                 rank: int | None = None, world_size: int | None = None) -> Any:
        """A PyTorch ``IterableDataset`` that follows this stream (the ``torch`` extra).

        Every DataLoader worker (forked: the Linux default) follows its own copy of the stream
        from this position, one change per snapshot, and reads its share of each change's
        splits (dealt by snapshot id and split index), so together the workers of all ranks
        read each row once; see :func:`arrowlake.torch.StreamSplits`. The dataset does not
        commit a consumer's progress.
        """
        return adapter("torch.stream")(
            self, batch_size=batch_size, shuffle_buffer=shuffle_buffer, seed=seed,
            drop_last=drop_last, output=output, rank=rank, world_size=world_size)

    def _worker_copy(self) -> None:
        """Make this (forked) copy read alone: no read-ahead, and no threads or futures of the
        process it was copied from; and without catch-up, so that every copy cuts the history
        into the same changes (one per snapshot, each planned from its snapshot alone) however
        far behind it polls."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # in a forked copy its threads never existed
        self._prefetch = False
        self._pool = None
        self._prefetched = {}
        self.catch_up_threshold = None

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Change:
        while not self._closed:
            self._wake.clear()  # before polling: a commit from now on cuts the wait short
            started = time.monotonic()
            change = self.poll()
            if change is not None:
                return change
            if self.stop_at_latest:
                self._finished()
                break
            # Polls start every poll_interval: the poll's own time is part of the interval.
            self._wake.wait(self._wait(started))
        raise StopIteration

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Change:
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        with self._lock:
            self._async_wakers.append(wake)
        try:
            while not self._closed:
                woken.clear()
                started = time.monotonic()
                change = await asyncio.to_thread(self.poll)
                if change is not None:
                    return change
                if self.stop_at_latest:
                    self._finished()
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), self._wait(started))
        finally:
            with self._lock:
                self._async_wakers.remove(wake)
        raise StopAsyncIteration

    def _finished(self) -> None:
        """A ``stop_at_latest`` iteration ended: give the consumer id up (commits stay
        accepted while no other stream holds it; iterating again takes it again)."""
        if self._lease is not None:
            self._lease.release()

    def _wait(self, started: float) -> float:
        """Seconds to wait for a signal before the next poll (a consumer's stream polls often
        enough to keep its lease)."""
        wait = started + self.poll_interval - time.monotonic()
        if self._lease is not None:
            wait = min(wait, leases.LEASE_SECONDS / 4)
        return max(0.0, wait)

    def poll(self) -> Change | None:
        """The next change, or None when caught up (never waits). Raises TableNotFound once
        the table was dropped (a table created since under the same name is another table)."""
        if self._closed:
            return None
        if self._lease is not None:
            self._lease.keep()
        if self._full_at is not None:
            snapshot_id, self._full_at = self._full_at, None
            info = self._metastore.snapshot(self._table_id, snapshot_id)
            return self._full_change(snapshot_id, int(info["committed_at"]))
        if not self._queue:
            self._fetch()
        threshold = self.catch_up_threshold
        if threshold is not None and len(self._queue) > threshold:
            change = self._catch_up()
            if change is not None:
                return change
        while self._queue:
            snap = self._queue.popleft()
            change = self._take_planned(snap)
            self.position = snap.snapshot_id
            if change is not None:
                self._start_prefetch()
                return change
        with self._changed_lock:
            self._changed.clear()  # files of trailing snapshots that changed nothing here
        return None

    def _fetch(self) -> None:
        rows = self._metastore.snapshots_after(self._table_id, self.position, _POLL_BATCH)
        if rows and rows[0]["snapshot_id"] != self.position + 1:
            who = f"Consumer {self.consumer!r}" if self.consumer else "The stream"
            raise SnapshotNotFound(
                f"{who} of table {self._table.name} resumes after snapshot {self.position}, "
                f"but snapshots {self.position + 1} to {rows[0]['snapshot_id'] - 1} have "
                "expired, so their changes are lost. Start again with start='full' (for a "
                "consumer: table.drop_consumer(id) first), and keep consumers committing within "
                "the table's consumer.expiration")
        self._queue.extend(
            _Snapshot(int(r["snapshot_id"]), str(r["kind"]), int(r["committed_at"]),
                      json.loads(r["summary"] or "{}"),
                      int(r["added_files"] or 0) + int(r["removed_files"] or 0),
                      None if r["schema_id"] is None else int(r["schema_id"]))
            for r in rows)

    def _files_changed(self, snap: _Snapshot) -> tuple[pa.Table, pa.Table]:
        """The files ``snap`` added and removed. When more snapshots are queued (the stream is
        behind), one range query fetches the files of the next ones (up to ``_BATCH_FILES``
        files) and splits them per snapshot in Arrow, instead of two queries per snapshot."""
        sid = snap.snapshot_id
        with self._changed_lock:
            cached = self._changed.pop(sid, None)
            for passed in [k for k in self._changed if k < sid]:  # skipped (no-change) ones
                del self._changed[passed]
            if cached is not None:
                return cached
            window = [sid]
            total = snap.files
            for nxt in list(self._queue):
                if nxt.snapshot_id <= window[-1]:
                    continue
                if nxt.snapshot_id != window[-1] + 1 or total + nxt.files > _BATCH_FILES:
                    break
                window.append(nxt.snapshot_id)
                total += nxt.files
            added, removed = self._metastore.files_changed(self._table_id, sid - 1, window[-1])
            if len(window) == 1:
                return added, removed
            parts = zip(_by_snapshot(added, "added_snapshot", window),
                        _by_snapshot(removed, "removed_snapshot", window), strict=True)
            for snapshot_id, pair in zip(window, parts, strict=True):
                self._changed[snapshot_id] = pair
            return self._changed.pop(sid)

    # -- planning ----------------------------------------------------------------------------

    def _view(self, snapshot_id: int | None) -> TableView:
        return TableView(self._metastore, self._table._storage, self._record, snapshot_id,
                         self._schema)

    def _keep(self, files: pa.Table) -> pa.Table:
        """The files of this stream's shard: by bucket, or by file id on append tables."""
        if self._keep_buckets is None or files.num_rows == 0:
            return files
        by_bucket = self._merge is not None or self._record.deletion_vectors
        ids = files.column("bucket" if by_bucket else "file_id")
        return files.filter(pc.fill_null(self._keep_buckets(pc.cast(ids, pa.int64())), False))

    def _prune(self, files: pa.Table) -> pa.Table:
        """Drop files whose statistics prove no row matches the filter (on key tables, only
        key conjuncts prune: a run's other columns say nothing about its retractions)."""
        expr = self._expr
        if self._merge is not None:
            keys = set(self._record.primary_key)
            expr = and_all([c for c in conjuncts(expr) if referenced_columns(c) <= keys])
        if isinstance(expr, AlwaysTrue) or files.num_rows == 0:
            return files
        cols = [c for c in sorted(referenced_columns(expr)) if c in self._schema.names]
        if not cols:
            return files
        stats = file_stats(files, self._schema, cols)
        return files.filter(pc.fill_null(may_match(expr, stats, self._schema), True))

    def _splits(self, view: TableView, files: pa.Table, *, row_kind: str | None,
                merged: bool, expr: Expr | None = None) -> list[ChangeSplit]:
        """Change splits over ``files``: merged per bucket (``merged``), or read as written,
        with the row-kind column of primary-key runs when ``row_kind`` is None."""
        if files.num_rows == 0:
            return []
        tasks = file_tasks(view, files)
        schemas = file_schemas(view, tasks)
        schema = view.schema
        columns = self._columns
        merge = self._merge if merged else None
        if self._merge is not None:
            schemas = {sid: s.append(KIND_FIELD) for sid, s in schemas.items()}
        if row_kind is None:
            schema = schema.append(KIND_FIELD)
            columns = (*columns, KIND_COLUMN)
        if expr is None:
            expr = self._expr
        groups = group_tasks(tasks, whole_buckets=merge is not None, target_bytes=_SPLIT_BYTES)
        partition_by = tuple(self._record.partition_by)
        return [
            ChangeSplit(
                Split(view.storage, tuple(group),
                      {sid: schemas[sid] for sid in {t.schema_id for t in group}}, schema,
                      columns, expr, None, merge, partition_by=partition_by),
                row_kind, self.include_row_kind, self._columns)
            for group in groups
        ]

    def _change(self, first: int, snap: _Snapshot | None, snapshot_id: int, kind: str,
                committed_at: int, splits: Sequence[AnySplit]) -> Change:
        when = datetime.fromtimestamp(committed_at / 1000, UTC)
        return Change(snapshot_id, kind, when, tuple(splits), self.schema, first)

    def _full_change(self, snapshot_id: int, committed_at: int) -> Change:
        view = self._view(snapshot_id)
        files = self._keep(plan_files(view, self._expr))
        splits = self._splits(view, files, row_kind="+I", merged=self._merge is not None)
        return self._change(snapshot_id, None, snapshot_id, "full", committed_at, splits)

    def _plan(self, snap: _Snapshot) -> Change | None:
        """The change of one snapshot, or None when it changed no rows of this stream."""
        if snap.kind in _NO_CHANGE_KINDS and "changelog" not in snap.summary:
            return None  # (a full compaction of a full-compaction table has a changelog)
        sid = snap.snapshot_id
        added, removed = self._files_changed(snap)
        kept = self._keep(added)
        added, removed = self._prune(kept), self._prune(self._keep(removed))
        view = self._view(sid)
        splits: list[AnySplit] = []
        is_log = pc.equal(added.column("content"), "changelog")
        changelog, added = added.filter(is_log), added.filter(pc.invert(is_log))
        if self._merge is not None and snap.summary.get(REFERENCING_SUMMARY) is not None:
            # A lookup changelog that refers to the runs the snapshot added: read by bucket,
            # with all of its changelog files (pruned by the runs' key ranges).
            is_run = pc.equal(kept.column("content"), "data")
            splits += self._referencing_splits(view, kept.filter(pc.invert(is_run)),
                                               kept.filter(is_run))
        elif self._merge is not None and (changelog.num_rows or "changelog" in snap.summary):
            # The table's changelog producer wrote what this snapshot changed.
            splits += self._splits(view, changelog, row_kind=None, merged=False)
        elif self._record.deletion_vectors:
            is_data = pc.equal(added.column("content"), "data")
            splits += self._vector_changes(snap, view, added.filter(is_data), removed)
        elif self._merge is not None:
            if removed.num_rows:
                # An overwrite of partitions: their rows as they were, retracted.
                splits += self._splits(self._view(sid - 1), removed, row_kind="-D",
                                       merged=True)
            splits += self._splits(view, added, row_kind=None, merged=False)
        else:
            splits += self._append_table_splits(snap, view, added, removed)
        if not splits:
            return None
        return self._change(sid, snap, sid, snap.kind, snap.committed_at, splits)

    def _vector_changes(self, snap: _Snapshot, view: TableView, added: pa.Table,
                        removed: pa.Table) -> list[AnySplit]:
        """A merge-on-write snapshot's change: the rows at the positions it deleted and the
        rows of the files it added, paired by key, one split per partition and bucket."""
        sid = snap.snapshot_id
        ms, tid = self._metastore, self._table_id
        grown = ms.vectors_changed(tid, sid)
        before_view = self._view(sid - 1)
        touched = ms.live_files(tid, sid - 1, buckets=None) if grown else None
        gone: list[tuple[FileTask, VectorRef]] = []
        if touched is not None and touched.num_rows:
            touched = self._prune(self._keep(touched.filter(
                pc.is_in(touched.column("file_id"), pa.array(grown, pa.int64())))))
            tasks = file_tasks(before_view, touched)
            now = ms.live_vectors(tid, sid, [t.file_id for t in tasks])
            for task in tasks:
                new = now[task.file_id]
                ref = VectorRef(new.cardinality, new.blob, None if new.puffin_path is None
                                else view.storage.join(view.location, new.puffin_path),
                                new.blob_offset or 0, new.blob_length or 0, new.added_snapshot)
                positions = ref.positions(view.storage, task.path)
                if task.deletes is not None and task.deletes.cardinality:
                    positions = np.setdiff1d(
                        positions, task.deletes.positions(view.storage, task.path),
                        assume_unique=True)
                if len(positions):
                    gone.append((replace(task, deletes=None), VectorRef(
                        len(positions), dv_encode(dv_vector_of(positions)))))
        new_tasks = file_tasks(view, added)
        # Files an overwrite removed, with their vectors as of the snapshot before.
        dropped = file_tasks(before_view, removed) if removed.num_rows else []
        units: dict[tuple[str | None, int | None],
                    tuple[list[Any], list[FileTask], list[FileTask]]] = {}
        for task, ref in gone:
            units.setdefault((task.partition_values, task.bucket), ([], [], []))[0].append(
                (task, ref))
        for task in new_tasks:
            units.setdefault((task.partition_values, task.bucket), ([], [], []))[1].append(task)
        for task in dropped:
            units.setdefault((task.partition_values, task.bucket), ([], [], []))[2].append(task)
        everything = tuple(self._schema.names)
        out: list[AnySplit] = []
        for olds, news, gones in units.values():
            schemas = file_schemas(before_view, [t for t, _ in olds])
            after = self._split(view, news, merged=False, columns=everything,
                                expr=AlwaysTrue()) if news else None
            before = self._split(before_view, gones, merged=False, columns=everything,
                                 expr=AlwaysTrue()) if gones else None
            out.append(VectorChangeSplit(view.storage, tuple(olds), schemas, after, before,
                                         self._schema, tuple(self._record.primary_key),
                                         self._columns, self.include_row_kind, self._expr))
        return out

    def _referencing_splits(self, view: TableView, changelog: pa.Table, runs: pa.Table
                            ) -> list[AnySplit]:
        """One split per partition and bucket of a format-2 lookup changelog: the runs the
        snapshot added there (in key order, the order positions count in) and the changelog
        files there, if any. A key filter prunes whole buckets by their runs' key ranges: every
        row of a bucket's change carries the key of one of its runs' rows."""
        runs = self._prune(runs)
        if runs.num_rows == 0:
            return []
        key = self._record.primary_key
        log_tasks, run_tasks = file_tasks(view, changelog), file_tasks(view, runs)
        schemas = file_schemas(view, [*log_tasks, *run_tasks])
        needed = tuple(self._columns) + tuple(
            c for c in sorted(referenced_columns(self._expr)) if c not in self._columns)
        partition_by = tuple(self._record.partition_by)
        table = self._record.full_name
        logs: dict[tuple[int | None, int | None], list[FileTask]] = {}
        for task in log_tasks:
            logs.setdefault((task.partition_id, task.bucket), []).append(task)
        by_unit: dict[tuple[int | None, int | None], list[FileTask]] = {}
        for task in run_tasks:
            by_unit.setdefault((task.partition_id, task.bucket), []).append(task)
        out: list[AnySplit] = []
        for unit, tasks in by_unit.items():
            tasks.sort(key=lambda t: (t.key_range is None, t.key_range or (), t.file_id))
            run = Split(view.storage, tuple(tasks),
                        {t.schema_id: schemas[t.schema_id].append(KIND_FIELD) for t in tasks},
                        view.schema.append(KIND_FIELD), (*needed, KIND_COLUMN),
                        partition_by=partition_by, table=table)
            found = logs.get(unit)
            log = Split(view.storage, tuple(found),
                        {t.schema_id: log_schema(schemas[t.schema_id], key) for t in found},
                        log_schema(view.schema, key), (*needed, KIND_COLUMN, AFTER_COLUMN),
                        partition_by=partition_by, table=table) if found else None
            out.append(ReferencedChangeSplit(log, run, needed, AFTER_COLUMN, UNCHANGED,
                                             self._expr, self.include_row_kind,
                                             self._columns, view.schema))
        return out

    def _append_table_splits(self, snap: _Snapshot, view: TableView, added: pa.Table,
                             removed: pa.Table) -> list[ChangeSplit]:
        """Append tables: added files as ``+I``. A delete or overwrite records its filter and
        the files it rewrote: the removed files' rows matching the filter are exactly the rows
        it removed (``-D``), the rewritten files only carry rows over and yield nothing."""
        splits: list[ChangeSplit] = []
        recorded = snap.summary.get("filter")
        carried = set(snap.summary.get("rewritten_paths", ()))
        if removed.num_rows:
            if recorded is not None:
                removed_by = self._in_current_names(
                    parse_filter(recorded), snap) if recorded else AlwaysTrue()
                expr = and_all([removed_by, self._expr])
            else:
                expr = self._expr
            splits += self._splits(self._view(snap.snapshot_id - 1), removed, row_kind="-D",
                                   merged=False, expr=expr)
        if carried and added.num_rows:
            new = pc.invert(pc.is_in(added.column("path"), pa.array(sorted(carried))))
            added = added.filter(new)
        splits += self._splits(view, added, row_kind="+I", merged=False)
        return splits

    def _in_current_names(self, expr: Expr, snap: _Snapshot) -> Expr:
        """A filter recorded by ``snap`` in the column names of its time, in the names of the
        schema this stream reads (columns matched by field id: a later rename, or a new column
        taking an old name, does not change which rows it selects)."""
        if snap.schema_id is None:
            return expr
        then = self._metastore.schema(self._table_id, snap.schema_id)
        now = {field_id(f): f.name for f in self._schema}
        mapping: dict[str, str] = {}
        for name in referenced_columns(expr):
            top = name.split(".", 1)[0]
            if top not in then.names:
                continue
            current = now.get(field_id(then.field(top)))
            if current is None:
                raise ValidationError(
                    f"Snapshot {snap.snapshot_id} of table {self._table.name} deleted rows by "
                    f"column '{top}', which has been dropped since: its removed rows cannot be "
                    "told apart any more. Start the stream after that snapshot (start='latest' "
                    "or a later snapshot id)")
            mapping[name] = current + name[len(top):]
        return rename_columns(expr, mapping) if mapping else expr

    # -- catch-up ----------------------------------------------------------------------------

    def _catch_up(self) -> Change | None:
        """One change for the whole range from the position to the current snapshot, or None
        when the range cannot be caught up at once (then it is read snapshot by snapshot).

        Primary-key tables: the net change per key (:mod:`arrowlake.streaming.catchup`).
        Append tables: the rows the range added, all ``+I``, planned with one query; a range
        holding a delete or overwrite is read per snapshot.
        """
        ms, tid, start = self._metastore, self._table_id, self.position
        end = ms.current_snapshot_id(tid)
        if end is None or end <= start:
            return None
        if start > 0:
            try:
                ms.snapshot(tid, start)
            except SnapshotNotFound:
                return None  # no state to compare with; per snapshot, expiry is reported
        snaps = ms.snapshots_after(tid, start, limit=end - start, upto=end)
        if len(snaps) != end - start:
            return None
        added, _ = ms.files_changed(tid, start, end)
        added = added.filter(pc.equal(added.column("content"), "data"))
        skipped = [int(r["snapshot_id"]) for r in snaps if r["kind"] in _NO_CHANGE_KINDS]
        if skipped and added.num_rows:
            added = added.filter(pc.invert(pc.is_in(added.column("added_snapshot"),
                                                    pa.array(skipped, pa.int64()))))
        added = self._prune(self._keep(added))
        if self._merge is not None:
            splits: list[AnySplit] = self._net_change_splits(start, end, added)
        else:
            if any(r["kind"] not in ("append", *_NO_CHANGE_KINDS) for r in snaps):
                return None
            splits = list(self._splits(self._view(end), added, row_kind="+I", merged=False))
        self._queue.clear()
        for future in self._prefetched.values():
            future.cancel()
        self._prefetched.clear()
        with self._changed_lock:
            self._changed.clear()
        self.position = end
        if not splits:
            return None
        return Change(end, "catch-up", datetime.fromtimestamp(snaps[-1]["committed_at"] / 1000,
                                                               UTC),
                      tuple(splits), self.schema, start + 1)

    def _net_change_splits(self, start: int, end: int, added: pa.Table) -> list[AnySplit]:
        if added.num_rows == 0:
            return []
        ms, tid = self._metastore, self._table_id

        def unit_ids(files: pa.Table) -> pa.Array:
            # (partition, bucket) as one integer; unpartitioned tables have null partitions.
            pid = pc.cast(pc.fill_null(files.column("partition_id"), -1), pa.int64())
            bucket = pc.cast(pc.fill_null(files.column("bucket"), 0), pa.int64())
            return pc.add(pc.multiply(pc.add(pid, 1), 1 << 32), bucket)

        touched_units = pc.unique(unit_ids(added))

        def in_touched(files: pa.Table) -> pa.Table:
            if files.num_rows == 0:
                return files
            return files.filter(pc.is_in(unit_ids(files), touched_units))

        before_files = in_touched(ms.live_files(tid, start)) if start > 0 else None
        after_files = in_touched(ms.live_files(tid, end))
        views = {"after": self._view(end), "before": self._view(start)}
        groups: dict[int, dict[str, list[Any]]] = {}
        for name, files in (("after", after_files), ("before", before_files)):
            if files is None or files.num_rows == 0:
                continue
            units = unit_ids(files).to_pylist()
            for unit, task in zip(units, file_tasks(views[name], files), strict=True):
                groups.setdefault(unit, {}).setdefault(name, []).append(task)
        key = tuple(self._record.primary_key)
        everything = tuple(self._schema.names)
        packed: list[dict[str, list[Any]]] = []
        size = 0
        for unit in sorted(groups):
            parts = groups[unit]
            unit_size = sum(t.file_size for tasks in parts.values() for t in tasks)
            if not packed or size + unit_size > _SPLIT_BYTES:
                packed.append({})
                size = 0
            for name, tasks in parts.items():
                packed[-1].setdefault(name, []).extend(tasks)
            size += unit_size
        out: list[AnySplit] = []
        for parts in packed:
            before = self._split(views["before"], parts["before"], merged=True,
                                 columns=everything, expr=AlwaysTrue()) \
                if parts.get("before") else None
            after = self._split(views["after"], parts["after"], merged=True,
                                columns=everything, expr=AlwaysTrue()) \
                if parts.get("after") else None
            out.append(NetChangeSplit(before, after, key, self._columns,
                                      self.include_row_kind, self._expr))
        return out

    def _split(self, view: TableView, tasks: Sequence[Any], *, merged: bool,
               columns: Sequence[str], expr: Expr) -> Split:
        schemas = file_schemas(view, tasks)
        if self._merge is not None:
            schemas = {sid: s.append(KIND_FIELD) for sid, s in schemas.items()}
        return Split(view.storage, tuple(tasks), schemas, view.schema, tuple(columns), expr,
                     None, self._merge if merged else None,
                     partition_by=tuple(self._record.partition_by))

    # -- prefetch ----------------------------------------------------------------------------

    def _take_planned(self, snap: _Snapshot) -> Change | None:
        future = self._prefetched.pop(snap.snapshot_id, None)
        if future is not None:
            return future.result()
        return self._plan(snap)

    def _start_prefetch(self) -> None:
        """Plan the next queued snapshot while the caller processes this change."""
        if not self._prefetch or not self._queue or self._closed:
            return
        nxt = self._queue[0]
        if nxt.snapshot_id in self._prefetched:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="arrowlake-stream")
        self._prefetched[nxt.snapshot_id] = self._pool.submit(self._plan_ahead, nxt)

    def _plan_ahead(self, snap: _Snapshot) -> Change | None:
        """Plan a snapshot and, when its files hold at most ``_PREFETCH_ROWS`` rows, read it."""
        change = self._plan(snap)
        if change is None or change.row_count > _PREFETCH_ROWS or self._closed:
            return change
        return replace(change, prefetched=change.to_arrow())


def _nothing() -> None:
    pass


def _release_all(releases: list[Callable[[], None]]) -> None:
    for release in releases:
        release()


def open_stream(table: Table, **options: Any) -> Stream:
    return Stream(table, **options)


register_stream_factory(open_stream)
