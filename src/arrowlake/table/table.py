"""The :class:`Table` facade: schema, snapshots, scans, writes and maintenance of one table."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from arrowlake.errors import CommitConflict, ValidationError
from arrowlake.expressions import Expr, to_arrow, to_expression
from arrowlake.io.stats import decode_values, stats_table
from arrowlake.metastore.inflight import registered_write
from arrowlake.metastore.records import deletion_vectors_on, epoch_ms
from arrowlake.scan.planning import TableView
from arrowlake.scan.scan import Scan
from arrowlake.scan.split import MergeSpec
from arrowlake.table import evolution
from arrowlake.table.maintenance import compaction, health, mode_switch, vector_compaction
from arrowlake.table.maintenance import housekeeping as maintenance
from arrowlake.table.maintenance.after_write import compact_after_write
from arrowlake.table.maintenance.compaction import CompactionResult
from arrowlake.table.maintenance.health import IcebergStatus, TableHealth
from arrowlake.table.maintenance.housekeeping import ExpireResult, OrphanResult
from arrowlake.table.options import primary_key as pk_options
from arrowlake.table.options.maintenance import warn_unsafe_properties
from arrowlake.table.state import Catalog, TableState
from arrowlake.table.writes import keyed as primary_key
from arrowlake.table.writes import plain as writes
from arrowlake.table.writes.commit import WriteResult
from arrowlake.table.writes.merge_into import MergeBuilder

if TYPE_CHECKING:
    import pandas as pd

    from arrowlake.io.storage import Storage
    from arrowlake.metastore.store import Metastore, TableRecord


class ChangeStream(Protocol):
    """What :meth:`Table.stream` returns: an :class:`arrowlake.streaming.Stream` (a layer
    above tables; see there for everything it offers)."""

    def __iter__(self) -> Iterator[Any]: ...

    def __aiter__(self) -> AsyncIterator[Any]: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...

    def commit(self, snapshot_id: int | None = None) -> None: ...

    def close(self) -> None: ...


#: Opens a change stream; set by :mod:`arrowlake.streaming` when it is imported (``import
#: arrowlake`` imports it). Streams sit above tables in the layers, so the table cannot import
#: them: it offers this hook instead.
_stream_factory: Callable[..., ChangeStream] | None = None


def register_stream_factory(factory: Callable[..., ChangeStream]) -> None:
    """Install what :meth:`Table.stream` calls (done once by ``arrowlake.streaming``)."""
    global _stream_factory
    _stream_factory = factory


#: Publishes a table's Iceberg metadata and returns where it is; set by
#: :mod:`arrowlake.iceberg` when it is imported (``arrowlake.lake`` imports it). That package
#: sits above tables in the layers, so the table offers this hook instead of importing it.
_iceberg_publisher: Callable[[Table, int | None], str] | None = None


def register_iceberg_publisher(publisher: Callable[[Table, int | None], str]) -> None:
    """Install what :meth:`Table.iceberg_metadata_location` calls (done by arrowlake.iceberg)."""
    global _iceberg_publisher
    _iceberg_publisher = publisher


#: Tells a table's Iceberg status for :meth:`Table.health`; set by :mod:`arrowlake.iceberg`.
_iceberg_status: Callable[[Table], IcebergStatus] | None = None


def register_iceberg_status(status: Callable[[Table], IcebergStatus]) -> None:
    """Install what :meth:`Table.health` asks for the table's Iceberg view."""
    global _iceberg_status
    _iceberg_status = status


class Table:
    """One table of a lake. Get it from :meth:`Lake.table` or :meth:`Lake.create_table`.

    >>> orders = lake.table("shop.orders")          # doctest: +SKIP
    >>> orders.append(pa.table({"order_id": [1]}))  # doctest: +SKIP
    """

    def __init__(self, lake: Catalog, record: TableRecord) -> None:
        self._lake = lake
        self._state = TableState(lake, record)

    # -- state ---------------------------------------------------------------------------------
    # The writes, keys, changelogs and maintenance below the facade work on its TableState.
    # The private names stay for the engines above tables (streams, Spark, Flight), which
    # read a table's record, metastore and storage through them.

    @property
    def state(self) -> TableState:
        """The table's state as the code below the facade takes it (record, metastore,
        storage); for engines and tools built on arrowlake's internals."""
        return self._state

    @property
    def _record(self) -> TableRecord:
        return self._state.record

    @_record.setter
    def _record(self, record: TableRecord) -> None:
        self._state.record = record

    @property
    def _metastore(self) -> Metastore:
        return self._state.metastore

    @property
    def _storage(self) -> Storage:
        return self._state.storage

    def refresh(self) -> Table:
        """Reload the table's metadata (schema, properties) from the metastore."""
        self._state.refresh()
        return self

    @property
    def name(self) -> str:
        return self._record.full_name

    @property
    def location(self) -> str:
        return self._record.location

    @property
    def schema(self) -> pa.Schema:
        """The current schema (fields carry their ids in metadata)."""
        return self._state.schema

    @property
    def partition_by(self) -> list[str]:
        return list(self._record.partition_by)

    @property
    def primary_key(self) -> list[str]:
        return list(self._record.primary_key)

    @property
    def buckets(self) -> int | None:
        """Hash buckets of a primary-key table (None for tables without a key)."""
        return self._record.buckets

    @property
    def properties(self) -> dict[str, str]:
        return dict(self._record.properties)

    def set_properties(self, **properties: str) -> None:
        """Set table properties (``write.target-file-size``, ``compaction.max-runs``, ...).

        Every property arrowlake reads is checked here, so a malformed value fails now rather
        than in a later write. The merge options of a primary-key table (``merge-engine``,
        ``sequence-field``, ``ignore-delete``, ``partial-update.ignore-delete``,
        ``aggregation.remove-record-on-delete``, ``fields.*``) are fixed at creation: the runs
        already written were merged under them. ``buckets`` is not a property (fixed at
        creation too).

        ``deletion-vectors.enabled`` switches the table's mode where no bucket needs a merge
        (after ``compact(full=True)``; see :mod:`arrowlake.table.maintenance.mode_switch`)."""
        given = {k.replace("_", "-") if k.startswith("write_") else k: str(v)
                 for k, v in properties.items()}
        key = self._record.primary_key
        to_vectors = mode_switch.requested_mode(self._state, given)
        if to_vectors is not None:
            given[pk_options.DELETION_VECTORS_PROPERTY] = "true" if to_vectors else "false"
        checked: list[int | None] = []  # the snapshot the switch was checked on

        def check(current: dict[str, str], snapshot: int | None, last: int
                  ) -> dict[str, str]:
            # Runs with the table's row locked, against its properties as they are then.
            fixed = sorted(k for k, v in given.items()
                           if pk_options.is_engine_property(k) and current.get(k) != v)
            if fixed and key:
                raise ValidationError(
                    f"Properties {fixed} of primary-key table '{self.name}' cannot be changed "
                    "after creation: the runs already written were merged under them. Create "
                    "a new table with the options you want and copy the rows into it")
            switch: dict[str, str] = {}
            if to_vectors is not None and deletion_vectors_on(current) != to_vectors:
                if checked != [snapshot]:
                    raise mode_switch.TableMoved(f"Table '{self.name}' changed meanwhile")
                switch = mode_switch.recorded_switch(current, last, to_vectors)
            merged = {**current, **given, **switch}
            pk_options.validate_properties(merged, key)
            if "consumer.expiration" in merged:
                maintenance.parse_duration("consumer.expiration", merged["consumer.expiration"])
            return switch

        warn_unsafe_properties(given)
        for _ in range(mode_switch.ATTEMPTS):
            self.refresh()
            checked.clear()
            if to_vectors is not None and self._record.deletion_vectors != to_vectors:
                snapshot = self.current_snapshot_id
                mode_switch.check_switchable(self._state, snapshot, to_vectors)
                checked.append(snapshot)
            try:
                self._metastore.update_properties(self._record.table_id, given, check)
                break
            except mode_switch.TableMoved:
                continue
        else:
            raise CommitConflict(
                f"Table '{self.name}' kept receiving commits while its mode was being switched "
                f"({mode_switch.ATTEMPTS} checks); nothing was changed. Try again when writes "
                "pause")
        self.refresh()

    @property
    def current_snapshot_id(self) -> int | None:
        """The latest snapshot id, read from the metastore on each access."""
        return self._metastore.current_snapshot_id(self._record.table_id)

    def __repr__(self) -> str:
        return f"<arrowlake.Table {self.name} snapshot={self.current_snapshot_id}>"

    def _check_write(self, commit_id: str | None = None) -> None:
        self._state.check_write(commit_id)

    def _writing(self, kind: str) -> AbstractContextManager[str | None]:
        """Run a write registered in flight (see metastore/inflight.py), so that orphan
        removal leaves its files alone until it commits or gives up."""
        return registered_write(self._metastore, self._record.table_id, kind)

    # -- streams -------------------------------------------------------------------------------

    def stream(self, *, consumer: str | None = None, start: str | int | datetime = "full",
               poll_interval: float = 1.0, shard: tuple[int, int] | None = None,
               buckets: Iterable[int] | None = None,
               bucket_filter: Callable[[int], bool] | None = None,
               include_row_kind: bool = False, filter: Expr | str | None = None,
               columns: Sequence[str] | None = None, stop_at_latest: bool = False,
               catch_up_threshold: int | None = 10, prefetch: bool = True) -> ChangeStream:
        """The table's changes as a stream, read with ``for`` or ``async for``.

        >>> with orders.stream(consumer="billing", start="full") as stream:  # doctest: +SKIP
        ...     for change in stream:
        ...         process(change.to_arrow())
        ...         stream.commit(change.snapshot_id)

        See :class:`arrowlake.streaming.Stream` and the README for every option.
        """
        if _stream_factory is None:
            raise RuntimeError("arrowlake.streaming.stream was not imported: it is whenever "
                               "arrowlake.lake is (tables from arrowlake.connect have it)")
        return _stream_factory(
            self, consumer=consumer, start=start, poll_interval=poll_interval, shard=shard,
            buckets=buckets, bucket_filter=bucket_filter, include_row_kind=include_row_kind,
            filter=filter, columns=columns, stop_at_latest=stop_at_latest,
            catch_up_threshold=catch_up_threshold, prefetch=prefetch)

    def consumers(self) -> pa.Table:
        """The table's stream consumers: ``consumer``, ``next_snapshot`` (where it resumes) and
        ``committed_at`` (its last progress commit)."""
        return self._metastore.consumers(self._record.table_id)

    def drop_consumer(self, consumer: str) -> None:
        """Forget a consumer's progress (it no longer holds snapshots back from expiry)."""
        if not self._metastore.drop_consumer(self._record.table_id, consumer):
            raise ValidationError(f"Table {self.name} has no consumer {consumer!r}")

    def _resolve_snapshot(self, snapshot: int | None, as_of: datetime | None,
                          tag: str | None, *, refreshed: bool = False) -> int | None:
        """The snapshot named by one of ``snapshot``, ``as_of`` and ``tag``, the current one
        when none is given. ``refreshed``: the record was just reloaded, so its current
        snapshot is the current one (no query for it)."""
        given = sum(x is not None for x in (snapshot, as_of, tag))
        if given > 1:
            raise ValidationError("Give at most one of snapshot=, as_of= and tag=")
        table_id = self._record.table_id
        if snapshot is not None:
            self._metastore.snapshot(table_id, snapshot)  # raises SnapshotNotFound
            return snapshot
        if as_of is not None:
            return self._metastore.snapshot_as_of(table_id, epoch_ms(as_of, "as_of"))
        if tag is not None:
            return self._metastore.tag(table_id, tag)
        return self._record.current_snapshot_id if refreshed else self.current_snapshot_id

    def _view(self, snapshot_id: int | None, *, current_schema: bool = False,
              refreshed: bool = False) -> TableView:
        return self._state.view(snapshot_id, current_schema=current_schema, refreshed=refreshed)

    # -- reading -------------------------------------------------------------------------------

    def scan(self, filter: Expr | str | None = None, columns: Sequence[str] | None = None, *,
             snapshot: int | None = None, as_of: datetime | None = None, tag: str | None = None,
             limit: int | None = None) -> Scan:
        """An immutable scan of the table at one snapshot (the latest by default).

        ``filter`` is an expression (``al.col("x") > 3``) or a string (``"x > 3 and y in (1,
        2)"``); ``snapshot``, ``as_of`` (a datetime) or ``tag`` travel back in time.
        """
        # One query reloads the table and, with it, names its current snapshot.
        self.refresh()
        snapshot_id = self._resolve_snapshot(snapshot, as_of, tag, refreshed=True)
        view = self._view(snapshot_id, refreshed=True)
        return Scan.create(view, filter, columns, limit,
                           self._merge_spec(view.schema, view.record))

    def scan_at(self, snapshot_id: int | None, filter: Expr | str | None = None,
                columns: Sequence[str] | None = None, *, limit: int | None = None) -> Scan:
        """A scan at exactly ``snapshot_id``; None is the table before its first commit (no
        rows), which :meth:`scan` cannot say (it reads the latest). For reads pinned by a lake
        transaction or a lake snapshot."""
        if snapshot_id is None:
            self.refresh()
            view = self._state.view(None)
            return Scan.create(view, filter, columns, limit,
                               self._merge_spec(view.schema, view.record))
        return self.scan(filter, columns, snapshot=snapshot_id, limit=limit)

    def _merge_spec(self, schema: pa.Schema | None = None,
                    record: TableRecord | None = None) -> MergeSpec | None:
        return self._state.merge_spec(schema, record)

    def to_arrow(self) -> pa.Table:
        return self.scan().to_arrow()

    def to_pandas(self, **kwargs: Any) -> pd.DataFrame:
        return self.scan().to_pandas(**kwargs)

    def count(self) -> int:
        return self.scan().count()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.scan().__arrow_c_stream__(requested_schema)

    def snapshots(self) -> pa.Table:
        """The table's history: one row per retained snapshot, oldest first."""
        snaps = self._metastore.snapshots(self._record.table_id)
        return snaps

    def history(self) -> list[dict[str, Any]]:
        """The snapshots as a list of dicts (summary decoded), for printing."""
        rows = self.snapshots().to_pylist()
        for row in rows:
            row["summary"] = json.loads(row["summary"] or "{}")
        return rows

    def files(self, snapshot: int | None = None) -> pa.Table:
        """The live data files with partition values, sizes, row counts and column statistics."""
        self.refresh()
        snapshot_id = self._resolve_snapshot(snapshot, None, None, refreshed=True)
        view = self._view(snapshot_id, refreshed=True)
        files = self._metastore.live_files(self._record.table_id, snapshot_id)
        out = {
            "file_id": files.column("file_id"),
            "path": pa.array([self._storage.join(self.location, p)
                              for p in files.column("path").to_pylist()], pa.string()),
            "added_snapshot": files.column("added_snapshot"),
            "row_count": files.column("row_count"),
            "file_size": files.column("file_size"),
            "schema_id": files.column("schema_id"),
        }
        if self._record.partition_by:
            parts = {pid: json.loads(values) for pid, _, values in
                     self._metastore.partitions(self._record.table_id)}
            pids = files.column("partition_id").to_pylist()
            arrays = []
            for i, name in enumerate(self._record.partition_by):
                typ = view.schema.field(name).type
                arrays.append(decode_values([parts[p][i] if p in parts else None
                                             for p in pids], typ))
            out["partition"] = pa.StructArray.from_arrays(arrays, list(self._record.partition_by))
        if self._record.buckets:
            out["bucket"] = files.column("bucket")
        stats = stats_table(files.column("stats").to_pylist(), files.column("row_count"),
                            view.schema, view.schema.names)
        for name in stats.column_names[1:]:
            out[name] = stats.column(name)
        return pa.table(out)

    # -- writing -------------------------------------------------------------------------------

    def append(self, data: Any, *, commit_id: str | None = None) -> WriteResult:
        """Add rows. ``data``: Arrow table/batches/reader, pandas DataFrame, any Arrow stream.

        ``commit_id`` makes the write idempotent: a second commit with the same id is skipped.
        On a primary-key table an append is an :meth:`upsert`.
        """
        self._check_write(commit_id)
        if self._record.primary_key:
            return self.upsert(data, commit_id=commit_id)
        with self._writing("append"):
            return writes.append(self._state, data, commit_id=commit_id)

    def upsert(self, data: Any, *, commit_id: str | None = None) -> WriteResult:
        """Insert or replace rows by primary key (merged on read by the table's merge engine)."""
        self._check_write(commit_id)
        with self._writing("upsert"):
            return compact_after_write(
                self._state, primary_key.upsert(self._state, data, commit_id=commit_id))

    def write_changes(self, data: Any, row_kind: str = "op", *,
                      commit_id: str | None = None) -> WriteResult:
        """Write CDC rows; column ``row_kind`` holds ``+I``, ``-U``, ``+U``, ``-D`` (or 0-3)."""
        self._check_write(commit_id)
        with self._writing("changes"):
            return compact_after_write(self._state, primary_key.write_changes(
                self._state, data, row_kind, commit_id=commit_id))

    def merge(self, source: Any, on: str | Sequence[str]) -> MergeBuilder:
        """Start a MERGE INTO with ``source``; finish with ``.execute()``.

        >>> (users.merge(src, on="user_id")                      # doctest: +SKIP
        ...       .when_matched_update(set={"email": "source.email"})
        ...       .when_not_matched_insert()
        ...       .execute())
        """
        self._check_write()
        return MergeBuilder.start(self._state, source, on, after_commit=compact_after_write)

    def compact(self, full: bool = False) -> CompactionResult:
        """Merge the runs of each bucket of a primary-key table (see compaction)."""
        self._check_write()
        pk_options.require_primary_key(self._state, "compact()")
        with self._writing("compact"):
            if self._record.deletion_vectors:
                return vector_compaction.compact_vectors(self._state, full=full)
            return compaction.compact(self._state, full=full)

    def overwrite(self, data: Any, filter: Expr | str | None = None, *,
                  commit_id: str | None = None) -> WriteResult:
        """Replace the rows matching ``filter`` (all rows when None) with ``data``.

        Every row of ``data`` must match ``filter``; the replacement is one atomic snapshot.
        On a primary-key table the filter may use only partition columns.
        """
        self._check_write(commit_id)
        with self._writing("overwrite"):
            if self._record.primary_key:
                return primary_key.overwrite(self._state, data, to_expression(filter),
                                             commit_id=commit_id)
            return writes.overwrite(self._state, data, to_expression(filter), commit_id=commit_id)

    def delete(self, filter: Expr | str, *, commit_id: str | None = None) -> WriteResult:
        """Delete the rows matching ``filter``, rewriting only files that match in part."""
        self._check_write(commit_id)
        expr = to_expression(filter)
        self.refresh()
        to_arrow(expr, self.schema)  # validate before touching anything
        with self._writing("delete"):
            if self._record.primary_key:
                return compact_after_write(
                    self._state, primary_key.delete_keys(self._state, expr, commit_id=commit_id))
            return writes.delete(self._state, expr, commit_id=commit_id)

    # -- schema --------------------------------------------------------------------------------

    def add_column(self, name: str, type: pa.DataType, *, nullable: bool = True) -> None:
        evolution.add_column(self._state, name, type, nullable=nullable)

    def rename_column(self, old: str, new: str) -> None:
        evolution.rename_column(self._state, old, new)

    def drop_column(self, name: str) -> None:
        evolution.drop_column(self._state, name)

    def alter_column(self, name: str, type: pa.DataType) -> None:
        evolution.alter_column(self._state, name, type)

    # -- tags ----------------------------------------------------------------------------------

    def create_tag(self, name: str, snapshot: int | None = None) -> None:
        """Name a snapshot (the current one by default); tagged snapshots never expire."""
        snap = snapshot if snapshot is not None else self.current_snapshot_id
        if snap is None:
            raise ValidationError("The table has no snapshot to tag yet")
        self._metastore.create_tag(self._record.table_id, name, snap)

    def drop_tag(self, name: str) -> None:
        self._metastore.drop_tag(self._record.table_id, name)

    def tags(self) -> dict[str, int]:
        return self._metastore.tags(self._record.table_id)

    # -- maintenance ---------------------------------------------------------------------------

    def expire_snapshots(self, older_than: datetime | timedelta | None = None,
                         retain_last: int = 1) -> ExpireResult:
        return maintenance.expire_snapshots(self._state, older_than, retain_last)

    def health(self) -> TableHealth:
        """Files, runs per bucket, deleted fraction, small files, snapshots, consumers' lag and
        the last maintenance actions (see :mod:`arrowlake.table.maintenance.health`)."""
        return health.table_health(
            self._state, None if _iceberg_status is None else _iceberg_status(self))

    def iceberg_metadata_location(self, snapshot: int | None = None) -> str:
        """Where the table's Iceberg v3 metadata JSON is (an absolute path or URI), as of
        ``snapshot`` (the current one by default), published first if it is not yet: Spark,
        DuckDB (``iceberg_scan``), pyiceberg and other Iceberg readers read the table from
        it. Raises :class:`~arrowlake.errors.NoIcebergView` for a table that has none (a
        merge-on-read primary-key table, a column of a type Iceberg lacks), saying why. See
        :mod:`arrowlake.iceberg`.

        >>> path = users.iceberg_metadata_location()  # doctest: +SKIP
        """
        if _iceberg_publisher is None:
            raise RuntimeError("arrowlake.iceberg was not imported: it is whenever "
                               "arrowlake.lake is (tables from arrowlake.connect have it)")
        return _iceberg_publisher(self, snapshot)

    def remove_orphan_files(self, older_than: timedelta = timedelta(days=1),
                            dry_run: bool = True) -> OrphanResult:
        return maintenance.remove_orphan_files(self._state, older_than, dry_run)
