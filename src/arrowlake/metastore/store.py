"""The SQL metastore: namespaces, tables, schemas, snapshots, files and tags as database rows.

One :class:`Metastore` wraps one SQLAlchemy engine. It is put together from parts, one module
each: :mod:`~arrowlake.metastore.database` (engines, transactions, migrations, the table-row
lock), :mod:`~arrowlake.metastore.commits` (one commit = one transaction that checks for
conflicts and records a snapshot and its files), :mod:`~arrowlake.metastore.streams` (stream and
consumer queries), :mod:`~arrowlake.metastore.maintenance` (the maintenance service's
leases and log); this module holds the catalog: namespaces, tables, schemas, snapshots, tags,
files and expiry. The records it exchanges are in :mod:`~arrowlake.metastore.records`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from arrowlake import schema as schemas_mod
from arrowlake.errors import (
    CommitConflict,
    MetastoreError,
    NamespaceNotFound,
    SnapshotNotFound,
    TableAlreadyExists,
    TableNotFound,
    TagNotFound,
)
from arrowlake.metastore import tables as t
from arrowlake.metastore.commits import Commits, live_file_columns
from arrowlake.metastore.database import Database, sqlite_read_only_uri
from arrowlake.metastore.iceberg import IcebergRecords
from arrowlake.metastore.inflight import InflightWrites
from arrowlake.metastore.maintenance import MaintenanceRecords
from arrowlake.metastore.records import (
    FILE_COLUMNS,
    FILE_SCHEMA,
    CommitResult,
    NewFile,
    PartitionIds,
    SnapshotChange,
    TableRecord,
    VectorRecord,
    check_commit_id,
    check_name,
    check_snapshot_id,
    now_ms,
    rows_to_table,
    vector_bytes,
)
from arrowlake.metastore.snapshot_cache import SnapshotCache
from arrowlake.metastore.streams import Streams

#: The snapshot row's id leads the rows of the queries that fill the snapshot cache.
_FOUND_FILE_SCHEMA = pa.schema([("_snapshot", pa.int64()), *FILE_SCHEMA])
#: A vector lookup by file ids fetches the snapshot's every vector instead (and keeps them)
#: when it has at most this many live data files, or the ids are a quarter of them or more.
_WHOLE_VECTORS_FILES = 4096


class Metastore(Commits, Streams, MaintenanceRecords, InflightWrites, IcebergRecords):
    """Namespaces, tables, snapshots and files in a SQL database.

    An SQLite database file this process may not write is opened read-only: reads work, every
    write raises :class:`ReadOnlyLake` at once.
    """

    def __init__(self, url: str, *, commit_retries: int = 100) -> None:
        #: What committed snapshots read (live files, live vectors), kept for later plans:
        #: see :mod:`~arrowlake.metastore.snapshot_cache` for why entries never go stale.
        self.snapshot_cache = SnapshotCache()
        super().__init__(url, commit_retries=commit_retries)

    def close(self) -> None:
        self.snapshot_cache.clear()
        super().close()

    # -- namespaces ----------------------------------------------------------------------------

    def create_namespace(self, name: str, *, exist_ok: bool = True,
                         properties: dict[str, str] | None = None) -> None:
        check_name("namespace", name)
        try:
            with self._write() as conn:
                exists = conn.execute(
                    sa.select(t.namespaces.c.name).where(t.namespaces.c.name == name)
                ).first()
                if exists is not None:
                    if not exist_ok:
                        raise TableAlreadyExists(f"Namespace '{name}' exists already")
                    return
                conn.execute(t.namespaces.insert().values(
                    name=name, properties=json.dumps(properties or {}), created_at=now_ms()))
        except IntegrityError:
            if not exist_ok:
                raise TableAlreadyExists(f"Namespace '{name}' exists already") from None

    def namespaces(self) -> list[str]:
        with self._read() as conn:
            rows = conn.execute(sa.select(t.namespaces.c.name).order_by(t.namespaces.c.name))
            return [r[0] for r in rows]

    def drop_namespace(self, name: str) -> None:
        with self._write() as conn:
            count = conn.execute(
                sa.select(sa.func.count()).select_from(t.tables)
                .where(t.tables.c.namespace == name)
            ).scalar_one()
            if count:
                raise MetastoreError(
                    f"Namespace '{name}' still holds {count} tables: drop them first"
                )
            res = conn.execute(t.namespaces.delete().where(t.namespaces.c.name == name))
            if res.rowcount == 0:
                raise NamespaceNotFound(f"Namespace '{name}' does not exist")

    # -- tables --------------------------------------------------------------------------------

    def create_table(
        self,
        namespace: str,
        name: str,
        *,
        location: str,
        schema: pa.Schema,
        last_field_id: int,
        partition_by: Sequence[str] = (),
        primary_key: Sequence[str] = (),
        buckets: int | None = None,
        properties: dict[str, str] | None = None,
    ) -> TableRecord:
        check_name("table", name)
        self.create_namespace(namespace)
        created = now_ms()
        try:
            with self._write() as conn:
                exists = conn.execute(
                    sa.select(t.tables.c.table_id).where(
                        (t.tables.c.namespace == namespace) & (t.tables.c.name == name))
                ).first()
                if exists is not None:
                    raise TableAlreadyExists(f"Table '{namespace}.{name}' exists already")
                table_id = conn.execute(t.tables.insert().values(
                    namespace=namespace, name=name, location=location, current_schema_id=0,
                    current_snapshot_id=None, last_snapshot_id=0, last_field_id=last_field_id,
                    partition_by=json.dumps(list(partition_by)),
                    primary_key=json.dumps(list(primary_key)), buckets=buckets,
                    properties=json.dumps(properties or {}), created_at=created,
                )).inserted_primary_key[0]  # type: ignore[index]
                conn.execute(t.schemas.insert().values(
                    table_id=table_id, schema_id=0, arrow_schema=schemas_mod.serialize(schema),
                    created_at=created))
        except IntegrityError:
            raise TableAlreadyExists(f"Table '{namespace}.{name}' exists already") from None
        return self.load_table(namespace, name)

    @staticmethod
    def _record(row: Any) -> TableRecord:
        return TableRecord(
            table_id=row.table_id, namespace=row.namespace, name=row.name, location=row.location,
            current_schema_id=row.current_schema_id, current_snapshot_id=row.current_snapshot_id,
            last_field_id=row.last_field_id, partition_by=tuple(json.loads(row.partition_by)),
            primary_key=tuple(json.loads(row.primary_key)), buckets=row.buckets,
            properties=json.loads(row.properties), created_at=row.created_at,
        )

    def load_table(self, namespace: str, name: str) -> TableRecord:
        check_name("namespace", namespace)
        check_name("table", name)
        with self._read() as conn:
            row = conn.execute(sa.select(t.tables).where(
                (t.tables.c.namespace == namespace) & (t.tables.c.name == name))).first()
        if row is None:
            raise TableNotFound(f"Table '{namespace}.{name}' does not exist")
        return self._record(row)

    def load_table_by_id(self, table_id: int) -> TableRecord:
        with self._read() as conn:
            row = conn.execute(sa.select(t.tables).where(t.tables.c.table_id == table_id)).first()
        if row is None:
            raise self._dropped(table_id)
        return self._record(row)

    def list_tables(self, namespace: str | None = None) -> list[tuple[str, str]]:
        query = sa.select(t.tables.c.namespace, t.tables.c.name).order_by(
            t.tables.c.namespace, t.tables.c.name)
        if namespace is not None:
            query = query.where(t.tables.c.namespace == namespace)
        with self._read() as conn:
            return [(r[0], r[1]) for r in conn.execute(query)]

    def table_locations(self) -> list[tuple[int, str, str]]:
        """``(table_id, "ns.table", location)`` of every table, in one query."""
        query = sa.select(t.tables.c.table_id, t.tables.c.namespace, t.tables.c.name,
                          t.tables.c.location)
        with self._read() as conn:
            return [(r[0], f"{r[1]}.{r[2]}", r[3]) for r in conn.execute(query)]

    @property
    def can_hold(self) -> bool:
        """Whether :meth:`commit_holding` can read through other connections while it holds
        the table (not an in-memory SQLite database, which has one connection)."""
        return not (self.dialect == "sqlite" and self.database_file() is None)

    def database_file(self) -> str | None:
        """The SQLite database file of this metastore (None for a server database)."""
        if self.engine.dialect.name != "sqlite":
            return None
        path = self.engine.url.database
        if not path or path == ":memory:" or path.startswith("file:"):
            return None
        return str(path)

    def drop_table(self, table_id: int) -> None:
        with self._write() as conn:
            self._lock_table(conn, table_id)
            for tbl in (t.files, t.partitions, t.tags, t.consumers, t.snapshots, t.schemas):
                conn.execute(tbl.delete().where(tbl.c.table_id == table_id))
            conn.execute(t.tables.delete().where(t.tables.c.table_id == table_id))
        # Ids are never reused, so no other table can hit these entries; free them anyway.
        for key in [k for k in self._schema_cache if k[0] == table_id]:
            self._schema_cache.pop(key, None)
        self.snapshot_cache.discard(table_id)

    def rename_table(self, table_id: int, namespace: str, name: str) -> None:
        check_name("table", name)
        self.create_namespace(namespace)
        try:
            with self._write() as conn:
                self._lock_table(conn, table_id)
                conn.execute(t.tables.update().where(t.tables.c.table_id == table_id)
                             .values(namespace=namespace, name=name))
        except IntegrityError:
            raise TableAlreadyExists(f"Table '{namespace}.{name}' exists already") from None

    def update_properties(
            self, table_id: int, changes: dict[str, str],
            check: Callable[[dict[str, str], int | None, int], dict[str, str] | None] | None
            = None) -> dict[str, str]:
        """Merge ``changes`` into the table's properties as they are when its row is locked
        (so a concurrent change to other properties, such as a rename rewriting
        ``fields.<col>.*``, is kept), after ``check(current, current_snapshot_id,
        last_snapshot_id)`` accepts them (it may return more changes: a mode switch records
        itself); returns the merged properties."""
        with self._write() as conn:
            row = self._lock_table(conn, table_id)
            current = json.loads(row.properties)
            if check is not None:
                more = check(current, row.current_snapshot_id, int(row.last_snapshot_id))
                changes = {**changes, **(more or {})}
            merged = {**current, **changes}
            conn.execute(t.tables.update().where(t.tables.c.table_id == table_id)
                         .values(properties=json.dumps(merged)))
        return merged

    # -- schemas -------------------------------------------------------------------------------

    def schema(self, table_id: int, schema_id: int) -> pa.Schema:
        key = (table_id, schema_id)
        cached = self._schema_cache.get(key)
        if cached is None:
            with self._read() as conn:
                data = conn.execute(sa.select(t.schemas.c.arrow_schema).where(
                    (t.schemas.c.table_id == table_id) & (t.schemas.c.schema_id == schema_id)
                )).scalar_one()
            cached = schemas_mod.deserialize(data)
            self._schema_cache[key] = cached
        return cached

    def add_schema(self, table_id: int, schema: pa.Schema, *, expected_schema_id: int,
                   last_field_id: int, properties: dict[str, str] | None = None,
                   expected_properties: dict[str, str] | None = None) -> int:
        """Make ``schema`` the table's current schema, if it is still at ``expected_schema_id``
        (and, in the same transaction, ``properties`` its properties when given: they were
        derived from ``expected_properties``, so a concurrent property change is a
        conflict rather than silently overwritten)."""
        values: dict[str, Any] = {"last_field_id": last_field_id}
        if properties is not None:
            values["properties"] = json.dumps(properties)
        with self._write() as conn:
            row = self._lock_table(conn, table_id)
            if properties is not None and expected_properties is not None \
                    and json.loads(row.properties) != expected_properties:
                raise CommitConflict(
                    "The table's properties were changed by another writer meanwhile; reload "
                    "the table and apply the schema change again")
            new_id = conn.execute(sa.select(sa.func.max(t.schemas.c.schema_id)).where(
                t.schemas.c.table_id == table_id)).scalar_one() + 1
            res = conn.execute(
                t.tables.update()
                .where((t.tables.c.table_id == table_id)
                       & (t.tables.c.current_schema_id == expected_schema_id))
                .values(current_schema_id=new_id, **values))
            if res.rowcount != 1:
                raise CommitConflict(
                    "The table's schema was changed by another writer meanwhile; reload the "
                    "table and apply the change again")
            conn.execute(t.schemas.insert().values(
                table_id=table_id, schema_id=new_id, arrow_schema=schemas_mod.serialize(schema),
                created_at=now_ms()))
        return int(new_id)

    # -- snapshots -----------------------------------------------------------------------------

    _SNAPSHOT_COLUMNS = ("snapshot_id", "parent_id", "kind", "committed_at", "schema_id",
                         "commit_id", "added_files", "removed_files", "added_rows",
                         "removed_rows", "total_files", "total_rows", "summary",
                         "transaction_id")

    def snapshots(self, table_id: int) -> pa.Table:
        cols = [t.snapshots.c[c] for c in self._SNAPSHOT_COLUMNS]
        with self._read() as conn:
            rows = conn.execute(sa.select(*cols).where(t.snapshots.c.table_id == table_id)
                                .order_by(t.snapshots.c.snapshot_id)).all()
        schema = pa.schema([
            ("snapshot_id", pa.int64()), ("parent_id", pa.int64()), ("kind", pa.string()),
            ("committed_at", pa.int64()), ("schema_id", pa.int32()), ("commit_id", pa.string()),
            ("added_files", pa.int64()), ("removed_files", pa.int64()),
            ("added_rows", pa.int64()), ("removed_rows", pa.int64()),
            ("total_files", pa.int64()), ("total_rows", pa.int64()), ("summary", pa.string()),
            # The lake transaction that committed the snapshot with other tables' (or null).
            ("transaction_id", pa.string()),
        ])
        table = rows_to_table(rows, schema)
        committed = table.column("committed_at").cast(pa.timestamp("ms", tz="UTC"))
        return table.set_column(3, pa.field("committed_at", committed.type), committed)

    def snapshot(self, table_id: int, snapshot_id: int) -> dict[str, Any]:
        snapshot_id = check_snapshot_id(snapshot_id)
        with self._read() as conn:
            row = conn.execute(sa.select(t.snapshots).where(
                (t.snapshots.c.table_id == table_id)
                & (t.snapshots.c.snapshot_id == snapshot_id))).first()
        if row is None:
            raise SnapshotNotFound(
                f"Snapshot {snapshot_id} does not exist (never committed, or expired)")
        return dict(row._mapping)

    def snapshot_as_of(self, table_id: int, at_ms: int) -> int:
        """The snapshot that was the table's current one at ``at_ms``.

        Commit times never decrease along the chain of snapshots (see ``_commit_once``), so it
        is the newest snapshot committed at or before ``at_ms``. When that one has expired, the
        newest retained one before it records (``superseded_at``) that it had been replaced by
        then: :class:`SnapshotNotFound`, never an older snapshot.
        """
        s = t.snapshots.c
        with self._read() as conn:
            row = conn.execute(
                sa.select(s.snapshot_id, s.superseded_at).where(
                    (s.table_id == table_id) & (s.committed_at <= at_ms))
                .order_by(s.snapshot_id.desc()).limit(1)).first()
        if row is None:
            raise SnapshotNotFound(
                "The table has no snapshot committed at or before that time (it was empty, or "
                "the snapshots of that time were expired)")
        if row[1] is not None and int(row[1]) <= at_ms:
            raise SnapshotNotFound(
                f"The snapshot that was current at that time has expired (snapshot {row[0]} is "
                "the newest one retained from before it, and it had been replaced by then); tag "
                "snapshots to keep them for time travel")
        return int(row[0])

    def current_snapshot_id(self, table_id: int) -> int | None:
        with self._read() as conn:
            row = conn.execute(sa.select(t.tables.c.current_snapshot_id).where(
                t.tables.c.table_id == table_id)).first()
        if row is None:
            raise self._dropped(table_id)
        return None if row[0] is None else int(row[0])

    # -- tags ----------------------------------------------------------------------------------

    def create_tag(self, table_id: int, name: str, snapshot_id: int) -> None:
        check_name("tag", name)
        snapshot_id = check_snapshot_id(snapshot_id)
        try:
            with self._write() as conn:
                self._lock_table(conn, table_id)
                exists = conn.execute(sa.select(t.snapshots.c.snapshot_id).where(
                    (t.snapshots.c.table_id == table_id)
                    & (t.snapshots.c.snapshot_id == snapshot_id))).first()
                if exists is None:
                    raise SnapshotNotFound(
                        f"Snapshot {snapshot_id} does not exist (never committed, or expired)")
                conn.execute(t.tags.insert().values(table_id=table_id, name=name,
                                                    snapshot_id=snapshot_id,
                                                    created_at=now_ms()))
        except IntegrityError:
            raise TableAlreadyExists(f"Tag '{name}' exists already") from None

    def _check_table(self, table_id: int) -> None:
        with self._read() as conn:
            row = conn.execute(sa.select(t.tables.c.table_id).where(
                t.tables.c.table_id == table_id)).first()
        if row is None:
            raise self._dropped(table_id)

    def tag(self, table_id: int, name: str) -> int:
        check_name("tag", name)
        with self._read() as conn:
            row = conn.execute(sa.select(t.tags.c.snapshot_id).where(
                (t.tags.c.table_id == table_id) & (t.tags.c.name == name))).first()
        if row is None:
            self._check_table(table_id)
            raise TagNotFound(f"Tag '{name}' does not exist")
        return int(row[0])

    def tags(self, table_id: int) -> dict[str, int]:
        with self._read() as conn:
            rows = conn.execute(sa.select(t.tags.c.name, t.tags.c.snapshot_id).where(
                t.tags.c.table_id == table_id).order_by(t.tags.c.name))
            return {r[0]: int(r[1]) for r in rows}

    def drop_tag(self, table_id: int, name: str) -> None:
        check_name("tag", name)
        with self._write() as conn:
            self._lock_table(conn, table_id)
            res = conn.execute(t.tags.delete().where(
                (t.tags.c.table_id == table_id) & (t.tags.c.name == name)))
        if res.rowcount == 0:
            raise TagNotFound(f"Tag '{name}' does not exist")

    # -- files ---------------------------------------------------------------------------------

    def partitions(self, table_id: int) -> list[tuple[int, str, str]]:
        """``(partition_id, path, values_json)`` for every partition the table ever had."""
        with self._read() as conn:
            rows = conn.execute(sa.select(
                t.partitions.c.partition_id, t.partitions.c.path,
                t.partitions.c.partition_values).where(t.partitions.c.table_id == table_id)
                .order_by(t.partitions.c.partition_id))
            return [(int(r[0]), r[1], r[2]) for r in rows]

    def partition_ids(self, table_id: int) -> PartitionIds:
        """The table's partitions, to find the id a written file's partition will get."""
        return PartitionIds.of(self.partitions(table_id))

    def live_files(self, table_id: int, snapshot_id: int | None,
                   partition_ids: Sequence[int] | None = None,
                   buckets: Sequence[int] | None = None, content: str = "data") -> pa.Table:
        """The data files of ``snapshot_id`` as an Arrow table (:data:`FILE_SCHEMA`, ordered by
        ``file_id``); with ``content="tombstone"`` the tombstone files of merge-on-write tables
        instead. ``removed_snapshot`` is null: as of the snapshot, none of them is removed.

        A committed snapshot's files are kept (:attr:`snapshot_cache`) once fetched whole;
        calls with ``partition_ids`` or ``buckets`` select from them when they are, and ask
        the database for only those files when they are not."""
        if snapshot_id is None or (partition_ids is not None and not partition_ids):
            return FILE_SCHEMA.empty_table()
        key = ("files", table_id, snapshot_id, content)
        files = self.snapshot_cache.get(key)
        if files is None and partition_ids is None and buckets is None:
            files = self._fetch_snapshot_files(table_id, snapshot_id, content)
        if files is None:
            return self._query_live_files(table_id, snapshot_id, partition_ids, buckets,
                                          content)
        mask = None
        if partition_ids is not None:
            mask = pc.is_in(files.column("partition_id"),
                            value_set=pa.array(list(partition_ids), pa.int64()))
        if buckets is not None:
            in_buckets = pc.is_in(files.column("bucket"),
                                  value_set=pa.array(list(buckets), pa.int32()))
            mask = in_buckets if mask is None else pc.and_(mask, in_buckets)
        return files if mask is None else files.filter(mask)

    @staticmethod
    def _live_file_rows(table_id: int, snapshot_id: int, content: str) -> Any:
        c = t.files.c
        return ((c.table_id == table_id) & (c.added_snapshot <= snapshot_id)
                & ((c.removed_snapshot.is_(None)) | (c.removed_snapshot > snapshot_id))
                & (c.content == content))

    def _query_live_files(self, table_id: int, snapshot_id: int,
                          partition_ids: Sequence[int] | None, buckets: Sequence[int] | None,
                          content: str) -> pa.Table:
        c = t.files.c
        query = sa.select(*live_file_columns()).where(
            self._live_file_rows(table_id, snapshot_id, content))
        if partition_ids is not None:
            query = query.where(c.partition_id.in_(list(partition_ids)))
        if buckets is not None:
            query = query.where(c.bucket.in_(list(buckets)))
        with self._read() as conn:
            rows = conn.execute(query.order_by(c.file_id)).all()
        return rows_to_table(rows, FILE_SCHEMA)

    def _fetch_snapshot_files(self, table_id: int, snapshot_id: int,
                              content: str) -> pa.Table | None:
        """Every live file of the snapshot, kept in the cache; None when the snapshot has no
        row (not committed, or expired): the rows found then may change, so none are kept.
        One statement finds the snapshot and its files, so both are of one state."""
        s, c = t.snapshots.c, t.files.c
        query = (sa.select(s.snapshot_id, *live_file_columns())
                 .select_from(t.snapshots.outerjoin(
                     t.files, self._live_file_rows(table_id, snapshot_id, content)))
                 .where((s.table_id == table_id) & (s.snapshot_id == snapshot_id))
                 .order_by(c.file_id))
        with self._read() as conn:
            rows = conn.execute(query).all()
        if not rows:
            return None
        if rows[0][1] is None:  # the snapshot's row joined to no file
            rows = []
        files = rows_to_table(rows, _FOUND_FILE_SCHEMA).drop_columns(["_snapshot"])
        self.snapshot_cache.put(("files", table_id, snapshot_id, content), files,
                                files.num_rows, files.nbytes)
        return files

    def all_file_paths(self, table_id: int) -> list[str]:
        """Every file any retained snapshot may read (live or removed but not yet expired):
        data and changelog files, Puffin files holding deletion vectors, and the files of the
        published Iceberg view that are still recorded (:mod:`~arrowlake.metastore.iceberg`)."""
        with self._read() as conn:
            rows = conn.execute(sa.select(t.files.c.path).where(t.files.c.table_id == table_id))
            paths = [r[0] for r in rows]
            puffins = conn.execute(sa.select(t.vectors.c.puffin_path).distinct().where(
                (t.vectors.c.table_id == table_id) & t.vectors.c.puffin_path.is_not(None)))
            paths += [r[0] for r in puffins]
            return paths + self.iceberg_file_paths(table_id, conn)

    def files_with_vectors_after(self, table_id: int, after: int | None) -> pa.Table:
        """The data files (:data:`FILE_SCHEMA`) whose deletion vector a snapshot after
        ``after`` extended: rows of theirs were replaced or deleted since."""
        c, v = t.files.c, t.vectors.c
        query = sa.select(*[c[n] for n in FILE_COLUMNS]).where(
            (c.table_id == table_id) & sa.exists().where(
                (v.table_id == table_id) & (v.file_id == c.file_id)
                & (v.added_snapshot > (-1 if after is None else after))))
        with self._read() as conn:
            rows = conn.execute(query.order_by(c.file_id)).all()
        return rows_to_table(rows, FILE_SCHEMA)

    def vectors_changed(self, table_id: int, snapshot_id: int) -> list[int]:
        """Ids of the data files whose deletion vector ``snapshot_id`` recorded (grew)."""
        v = t.vectors.c
        with self._read() as conn:
            return [int(r[0]) for r in conn.execute(sa.select(v.file_id).where(
                (v.table_id == table_id) & (v.added_snapshot == snapshot_id)))]

    def live_vectors(self, table_id: int, snapshot_id: int | None,
                     file_ids: Sequence[int] | None = None) -> Mapping[int, VectorRecord]:
        """The deletion vectors of ``snapshot_id`` by data file id (of ``file_ids`` only, when
        given); files without one are absent. Read-only: a committed snapshot's vectors are
        kept (:attr:`snapshot_cache`) and shared by later calls."""
        if snapshot_id is None:
            return {}
        key = ("vectors", table_id, snapshot_id)
        found: Mapping[int, VectorRecord] | None = self.snapshot_cache.get(key)
        if found is None and self._fetch_whole_vectors(table_id, snapshot_id, file_ids):
            found = self._fetch_snapshot_vectors(table_id, snapshot_id)
        if found is None:
            return self._query_live_vectors(table_id, snapshot_id, file_ids)
        if file_ids is None:
            return found
        return {fid: v for fid in file_ids if (v := found.get(fid)) is not None}

    def _fetch_whole_vectors(self, table_id: int, snapshot_id: int,
                             file_ids: Sequence[int] | None) -> bool:
        """Whether to fetch (and keep) every vector of the snapshot for a lookup of
        ``file_ids``: when the ids are not much fewer than the snapshot's live files."""
        if file_ids is None:
            return True
        files = self.snapshot_cache.get(("files", table_id, snapshot_id, "data"))
        return files is not None and (files.num_rows <= _WHOLE_VECTORS_FILES
                                      or 4 * len(file_ids) >= files.num_rows)

    @staticmethod
    def _vector_columns() -> list[Any]:
        v = t.vectors.c
        return [v.file_id, v.added_snapshot, v.cardinality, v.blob, v.puffin_path,
                v.blob_offset, v.blob_length]

    @staticmethod
    def _live_vector_rows(table_id: int, snapshot_id: int) -> Any:
        v = t.vectors.c
        return ((v.table_id == table_id) & (v.added_snapshot <= snapshot_id)
                & (v.removed_snapshot.is_(None) | (v.removed_snapshot > snapshot_id)))

    @staticmethod
    def _vector_record(r: Any) -> VectorRecord:
        return VectorRecord(int(r[0]), int(r[1]), int(r[2]),
                            None if r[3] is None else bytes(r[3]), r[4], r[5], r[6])

    def _query_live_vectors(self, table_id: int, snapshot_id: int,
                            file_ids: Sequence[int] | None) -> dict[int, VectorRecord]:
        v = t.vectors.c
        query = sa.select(*self._vector_columns()).where(
            self._live_vector_rows(table_id, snapshot_id))
        out: dict[int, VectorRecord] = {}
        with self._read() as conn:
            if file_ids is None:
                chunks: list[Sequence[int] | None] = [None]
            else:
                ids = list(file_ids)
                chunks = [ids[i:i + 500] for i in range(0, len(ids), 500)]
            for chunk in chunks:
                q = query if chunk is None else query.where(v.file_id.in_(list(chunk)))
                for r in conn.execute(q):
                    out[int(r[0])] = self._vector_record(r)
        return out

    def _fetch_snapshot_vectors(self, table_id: int, snapshot_id: int
                                ) -> Mapping[int, VectorRecord] | None:
        """Every live vector of the snapshot, kept in the cache (read-only); None when the
        snapshot has no row (see :meth:`_fetch_snapshot_files`)."""
        s = t.snapshots.c
        query = (sa.select(s.snapshot_id, *self._vector_columns())
                 .select_from(t.snapshots.outerjoin(
                     t.vectors, self._live_vector_rows(table_id, snapshot_id)))
                 .where((s.table_id == table_id) & (s.snapshot_id == snapshot_id)))
        with self._read() as conn:
            rows = conn.execute(query).all()
        if not rows:
            return None
        records = {} if rows[0][1] is None else {
            int(r[1]): self._vector_record(r[1:]) for r in rows}
        found = MappingProxyType(records)
        self.snapshot_cache.put(("vectors", table_id, snapshot_id), found, len(records),
                                vector_bytes(records.values()))
        return found

    # -- maintenance ---------------------------------------------------------------------------

    def expire_snapshots(self, table_id: int, expire: Sequence[int]) -> list[str]:
        """Delete the given snapshots and the file rows only they read; return those paths.

        Tagged snapshots are never expired. A file row is kept while a retained snapshot lies in
        ``[added_snapshot, removed_snapshot)``; live files are never touched.
        """
        if not expire:
            self._check_table(table_id)
            return []
        s, c = t.snapshots.c, t.files.c
        read_by_retained = sa.exists().where(
            (s.table_id == c.table_id) & (s.snapshot_id >= c.added_snapshot)
            & (s.snapshot_id < c.removed_snapshot))
        unread = (c.table_id == table_id) & c.removed_snapshot.is_not(None) & ~read_by_retained
        with self._write() as conn:
            self._lock_table(conn, table_id)
            tagged = sa.select(t.tags.c.snapshot_id).where(t.tags.c.table_id == table_id)
            conn.execute(t.snapshots.delete().where(
                (s.table_id == table_id) & s.snapshot_id.in_(list(expire))
                & s.snapshot_id.not_in(tagged)))
            paths = [r[0] for r in conn.execute(sa.select(c.path).where(unread))]
            conn.execute(t.files.delete().where(unread))
            paths += self._expire_vectors(conn, table_id)
        # Readers of an expired snapshot fail where they resolve it; free what it read.
        self.snapshot_cache.discard(table_id, expire)
        return paths

    @staticmethod
    def _expire_vectors(conn: Connection, table_id: int) -> list[str]:
        """Delete the vector rows no retained snapshot reads (and those of files gone); the
        Puffin files no remaining row refers to."""
        s, v, f = t.snapshots.c, t.vectors.c, t.files.c
        read_by_retained = sa.exists().where(
            (s.table_id == v.table_id) & (s.snapshot_id >= v.added_snapshot)
            & (s.snapshot_id < v.removed_snapshot))
        file_kept = sa.exists().where((f.table_id == v.table_id) & (f.file_id == v.file_id))
        unread = (v.table_id == table_id) & (
            (v.removed_snapshot.is_not(None) & ~read_by_retained) | ~file_kept)
        candidates = {r[0] for r in conn.execute(sa.select(v.puffin_path).distinct().where(
            unread & v.puffin_path.is_not(None)))}
        conn.execute(t.vectors.delete().where(unread))
        if not candidates:
            return []
        still = {r[0] for r in conn.execute(sa.select(v.puffin_path).distinct().where(
            (v.table_id == table_id) & v.puffin_path.in_(sorted(candidates))))}
        return sorted(candidates - still)


__all__ = ["CommitResult", "Database", "Metastore", "NewFile", "PartitionIds", "SnapshotChange",
           "TableRecord", "check_commit_id", "check_name", "now_ms", "sqlite_read_only_uri"]
