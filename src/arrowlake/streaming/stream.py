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
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ModeSwitched, SnapshotNotFound, ValidationError
from arrowlake.expressions import (
    AlwaysTrue,
    Expr,
    to_arrow,
    to_expression,
)
from arrowlake.metastore import signals
from arrowlake.metastore.records import deletion_vectors_at, epoch_ms, mode_switches
from arrowlake.metastore.store import check_name
from arrowlake.scan.adapters import adapter
from arrowlake.scan.split import MergeSpec
from arrowlake.schema import find_field
from arrowlake.streaming import leases
from arrowlake.streaming.change import AnySplit, Change
from arrowlake.streaming.planning import ChangePlanner, Snapshot
from arrowlake.streaming.splits import ROW_KIND_FIELD
from arrowlake.table.changelogs.net_change import NO_CHANGE_KINDS, changed_files
from arrowlake.table.changelogs.producers import last_full_compaction
from arrowlake.table.table import Table, register_stream_factory

#: Snapshots fetched per poll query.
_POLL_BATCH = 1000
#: The next change is read ahead (while the caller processes the current one) up to this many
#: rows; larger ones are only planned ahead.
_PREFETCH_ROWS = 2_000_000


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
        self._planner = ChangePlanner(table, self._expr, self._columns, self.include_row_kind,
                                      self._keep_buckets, self._merge, self.schema)
        self._queue: deque[Snapshot] = deque()
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
        # Held while closing, and by a poll while it renews the lease or starts a read-ahead:
        # a poll racing close() (another thread) neither takes the consumer id again after
        # close() gave it up nor starts a thread after close() stopped them.
        self._closing = threading.Lock()
        self._pid = os.getpid()
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
            return self._full_start(current)
        if start == "latest":
            return 0 if current is None else current
        if start == "earliest":
            earliest = ms.earliest_snapshot_id(tid)
            if earliest is None:
                return 0
            if ms.snapshot(tid, earliest)["parent_id"] is None:
                return earliest - 1  # the whole history is retained: replay it
            # Older snapshots expired: their changes are gone, the state they left is not.
            return self._full_start(earliest)
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
        """Stop the stream: iteration ends (a waiting ``for`` wakes up and finishes), and so
        does every thread it started (the read-ahead after the read it is in, if any)."""
        with self._closing:
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
        commit a consumer's progress; its ``close()`` closes this stream.
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
        if os.getpid() != self._pid:
            self._closing = threading.Lock()  # held by a thread of the parent at the fork?
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
        if self._lease is not None:
            with self._closing:
                if self._closed:
                    return None
                self._lease.keep()
        elif self._closed:
            return None
        if self._full_at is not None:
            snapshot_id, self._full_at = self._full_at, None
            info = self._metastore.snapshot(self._table_id, snapshot_id)
            return self._planner.full_change(snapshot_id, int(info["committed_at"]))
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

    def _full_compaction_table(self) -> bool:
        return self._record.properties.get("changelog-producer") == "full-compaction"

    def _full_start(self, snapshot_id: int) -> int:
        """Start with a full scan of ``snapshot_id``'s state and go on after it. On a
        ``full-compaction`` table the state streams hold is what full compactions leave: the
        scan reads the last one's (none before the first, whose change then brings every
        row), so the writes after it arrive once, with the next one's change."""
        if self._full_compaction_table():
            reference = last_full_compaction(self._table.state)
            if reference is None:
                return snapshot_id
            snapshot_id = reference
        self._full_at = snapshot_id
        return snapshot_id

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
        if rows:
            self._check_mode(int(rows[0]["snapshot_id"]), int(rows[-1]["snapshot_id"]))
        self._queue.extend(
            Snapshot(int(r["snapshot_id"]), str(r["kind"]), int(r["committed_at"]),
                      json.loads(r["summary"] or "{}"),
                      int(r["added_files"] or 0) + int(r["removed_files"] or 0),
                      None if r["schema_id"] is None else int(r["schema_id"]),
                      r["transaction_id"])
            for r in rows)

    def _files_changed(self, snap: Snapshot) -> tuple[pa.Table, pa.Table]:
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
        if self._full_compaction_table():
            # From the state the stream holds (the last full compaction it passed) to the
            # last full compaction: later writes arrive with the next one's change.
            end = last_full_compaction(self._table.state)
            if end is None or end <= start:
                return None
            start = last_full_compaction(self._table.state, at_or_before=start) or 0
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
        self._check_mode(start + 1, end)
        # The files whose partitions and buckets hold every row that may have changed (a
        # delete from a deletion-vector table adds no file, it extends vectors).
        changed = self._planner.prune(self._planner.keep(
            changed_files(self._table.state, start, end, snaps)))
        if self._merge is not None or self._record.deletion_vectors:
            splits: list[AnySplit] = self._planner.net_change_splits(start, end, changed)
        else:
            if any(r["kind"] not in ("append", *NO_CHANGE_KINDS) for r in snaps):
                return None
            splits = list(self._planner.splits(self._planner.view(end), changed, row_kind="+I",
                                               merged=False))
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

    def _check_mode(self, first: int, last: int) -> None:
        """Refuse snapshots ``first`` to ``last`` if the table's mode was switched so that some
        were written in another mode than this stream plans with (it does not follow a
        switch; each mode's changes are planned differently)."""
        if not self._record.primary_key:
            return
        props = self._metastore.load_table_by_id(self._table_id).properties
        mine = self._record.deletion_vectors
        inside = [at for at, _ in mode_switches(props) if first < at <= last]
        if deletion_vectors_at(props, first) == mine and not inside:
            return
        at = inside[0] if deletion_vectors_at(props, first) == mine else first
        modes = ("deletion vectors", "merge on read")
        raise ModeSwitched(
            f"Table {self._table.name} was switched to {modes[mine]} from snapshot {at} on; "
            f"this stream reads it in the mode it had when the stream was opened "
            f"({modes[not mine]}) and does not follow a switch. Reopen the stream (a consumer "
            f"resumes where it committed); one that must start before snapshot {at} can only "
            "start again after it (drop_consumer, then start='full')")

    def _plan(self, snap: Snapshot) -> Change | None:
        """The change of one snapshot, or None when it changed no rows of this stream."""
        if snap.kind in NO_CHANGE_KINDS and "changelog" not in snap.summary:
            return None  # (a full compaction of a full-compaction table has a changelog)
        added, removed = self._files_changed(snap)
        return self._planner.plan(snap, added, removed)

    def _take_planned(self, snap: Snapshot) -> Change | None:
        future = self._prefetched.pop(snap.snapshot_id, None)
        if future is not None:
            return future.result()
        return self._plan(snap)

    def _start_prefetch(self) -> None:
        """Plan the next queued snapshot while the caller processes this change."""
        if not self._prefetch or not self._queue:
            return
        nxt = self._queue[0]
        if nxt.snapshot_id in self._prefetched:
            return
        with self._closing:
            if self._closed:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="arrowlake-stream")
            self._prefetched[nxt.snapshot_id] = self._pool.submit(self._plan_ahead, nxt)

    def _plan_ahead(self, snap: Snapshot) -> Change | None:
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
