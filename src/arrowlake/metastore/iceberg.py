"""The published Iceberg view's records, part of :class:`~arrowlake.metastore.store.Metastore`.

:mod:`arrowlake.iceberg` publishes Iceberg metadata derived from the metastore; the rows here
(``al_iceberg_*``, see :mod:`arrowlake.metastore.tables`) record what it wrote:

- the current metadata of each table (``al_iceberg_tables``), changed only by a
  compare-and-swap on its ``version``, which every recorded publication increments: two
  publishers that planned on the same state cannot both record, and the one that lost plans
  again on what the other recorded;
- every metadata JSON written (``al_iceberg_metadata``), by the hash of its content;
- the manifest list of every published snapshot (``al_iceberg_snapshots``);
- the manifests, each used by the published snapshots in ``[added_snapshot,
  removed_snapshot)`` as a data file is by its snapshots, with the data files it holds;
- where each deletion vector is published (``al_iceberg_vectors``).

A publication is recorded in one transaction that also checks that its write is still
registered (:mod:`arrowlake.metastore.inflight`): its files were written first, under names
that orphan removal leaves alone while the registration lives, and once recorded they are in
:meth:`IcebergRecords.iceberg_file_paths` (and so in ``all_file_paths``). Expiry deletes the
rows (and hands back the files) that only expired snapshots used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from arrowlake.metastore import tables as t
from arrowlake.metastore.database import Database
from arrowlake.metastore.inflight import InflightWrites
from arrowlake.metastore.records import now_ms, rows_to_table

#: The columns of a data file an Iceberg manifest entry is made of.
ENTRY_FILE_SCHEMA = pa.schema([
    ("file_id", pa.int64()), ("path", pa.string()), ("partition_id", pa.int64()),
    ("added_snapshot", pa.int64()), ("schema_id", pa.int32()), ("row_count", pa.int64()),
    ("file_size", pa.int64()), ("stats", pa.string()), ("first_row_id", pa.int64()),
])

_CHUNK = 500


class PublicationRace(Exception):
    """Another publisher recorded first: the publication's files are not recorded; plan it
    again on what the other one recorded."""


@dataclass(frozen=True)
class ManifestRecord:
    """A manifest written by a publisher (see ``al_iceberg_manifests``)."""

    path: str
    content: int  # 0: data files, 1: deletion vectors
    added_snapshot: int
    length: int
    spec_key: str
    min_sequence: int
    added_files: int
    existing_files: int
    deleted_files: int
    added_rows: int
    existing_rows: int
    deleted_rows: int
    first_row_id: int | None
    partitions: str  # JSON
    min_file_id: int | None
    max_file_id: int | None
    file_ids: bytes = b""  # only when recording (and fetched on demand)

    def ids(self) -> np.ndarray:
        return np.frombuffer(self.file_ids, dtype="<i8")


@dataclass(frozen=True)
class PublishedVector:
    """Where a deletion vector is published (see ``al_iceberg_vectors``)."""

    file_id: int
    added_snapshot: int
    path: str
    offset: int
    length: int
    file_size: int
    copied: bool


@dataclass(frozen=True)
class VectorRow:
    """A deletion vector as the metastore records it (``al_vectors``)."""

    file_id: int
    added_snapshot: int
    cardinality: int
    blob: bytes | None
    puffin_path: str | None
    blob_offset: int | None
    blob_length: int | None


@dataclass(frozen=True)
class IcebergState:
    """What is published for a table, as one read saw it."""

    version: int | None  # of the table's al_iceberg_tables row (None: none yet)
    current_path: str | None
    current_snapshot: int | None
    snapshots: dict[int, str]  # published snapshot -> its manifest list
    manifests: list[ManifestRecord]  # those the newest published snapshot uses (no file ids)

    @property
    def head(self) -> int | None:
        """The newest published snapshot."""
        return max(self.snapshots) if self.snapshots else None


@dataclass(frozen=True)
class IcebergInputs:
    """What a publication reads of the metastore (see :meth:`IcebergRecords.iceberg_inputs`)."""

    state: IcebergState
    snapshots: list[dict[str, Any]]
    schema_times: dict[int, int]
    tags: list[tuple[str, int, int]]
    file_schema_ids: set[int]  # of every data file the table records


@dataclass(frozen=True)
class NewPublication:
    """What one publication wrote, to be recorded at once."""

    expected_version: int | None
    metadata_path: str
    metadata_snapshot: int | None
    content_hash: str
    listed: Sequence[int]  # the snapshots the metadata lists
    make_current: bool
    write_id: str | None = None
    snapshots: Mapping[int, str] = field(default_factory=dict)
    manifests: Sequence[ManifestRecord] = ()
    removed_manifests: Mapping[str, int] = field(default_factory=dict)  # path -> snapshot
    vectors: Sequence[PublishedVector] = ()
    #: The metadata file was recorded before (only the table's current metadata changes).
    metadata_exists: bool = False


class IcebergRecords(Database):
    """The published Iceberg view's queries (see the module docs)."""

    @contextmanager
    def _reading(self, conn: Connection | None) -> Iterator[Connection]:
        """``conn``, or a read connection of its own."""
        if conn is not None:
            yield conn
        else:
            with self._read() as own:
                yield own

    def iceberg_inputs(self, table_id: int) -> IcebergInputs:
        """What a publication reads, in one connection."""
        with self._read() as conn:
            return IcebergInputs(
                self.iceberg_state(table_id, conn), self.iceberg_snapshot_rows(table_id, conn),
                self.iceberg_schema_times(table_id, conn), self.iceberg_tag_rows(table_id, conn),
                self.iceberg_file_schema_ids(table_id, None, conn))

    # -- reading what was published --------------------------------------------------------

    def iceberg_state(self, table_id: int, conn: Connection | None = None) -> IcebergState:
        m = t.iceberg_manifests.c
        columns = [m[c.name] for c in t.iceberg_manifests.columns
                   if c.name not in ("table_id", "removed_snapshot", "file_ids")]
        with self._reading(conn) as conn:
            head = conn.execute(sa.select(
                t.iceberg_tables.c.version, t.iceberg_tables.c.metadata_path,
                t.iceberg_tables.c.snapshot_id).where(
                t.iceberg_tables.c.table_id == table_id)).first()
            snaps = {int(r[0]): r[1] for r in conn.execute(sa.select(
                t.iceberg_snapshots.c.snapshot_id, t.iceberg_snapshots.c.manifest_list).where(
                t.iceberg_snapshots.c.table_id == table_id))}
            rows = conn.execute(sa.select(*columns).where(
                (m.table_id == table_id) & m.removed_snapshot.is_(None)).order_by(
                m.added_snapshot, m.path)).all()
        manifests = [ManifestRecord(**dict(r._mapping)) for r in rows]
        if head is None:
            return IcebergState(None, None, None, snaps, manifests)
        return IcebergState(int(head[0]), head[1], head[2], snaps, manifests)

    def iceberg_current(self, table_id: int) -> tuple[str, int | None] | None:
        """The table's current metadata (path, snapshot), if it has one."""
        c = t.iceberg_tables.c
        with self._read() as conn:
            row = conn.execute(sa.select(c.metadata_path, c.snapshot_id).where(
                c.table_id == table_id)).first()
        if row is None or row[0] is None:
            return None
        return row[0], None if row[1] is None else int(row[1])

    def iceberg_metadata_path(self, table_id: int, *, content_hash: str | None = None,
                              snapshot_id: int | None = None) -> str | None:
        """The metadata file recorded with ``content_hash``, or the newest one of
        ``snapshot_id``."""
        c = t.iceberg_metadata.c
        query = sa.select(c.path).where(c.table_id == table_id)
        if content_hash is not None:
            query = query.where(c.content_hash == content_hash)
        else:
            query = query.where(c.snapshot_id == snapshot_id)
        with self._read() as conn:
            row = conn.execute(query.order_by(c.published_at.desc(), c.path).limit(1)).first()
        return None if row is None else str(row[0])

    def iceberg_manifest_ids(self, table_id: int, paths: Sequence[str]) -> dict[str, np.ndarray]:
        """The data file ids each of the manifests at ``paths`` holds."""
        m = t.iceberg_manifests.c
        out: dict[str, np.ndarray] = {}
        with self._read() as conn:
            for start in range(0, len(paths), _CHUNK):
                for path, ids in conn.execute(sa.select(m.path, m.file_ids).where(
                        (m.table_id == table_id) & m.path.in_(list(paths[start:start + _CHUNK])))):
                    out[path] = np.frombuffer(bytes(ids), dtype="<i8")
        return out

    def iceberg_vectors(self, table_id: int, keys: Sequence[tuple[int, int]]
                        ) -> dict[tuple[int, int], PublishedVector]:
        """Where the vectors ``(file_id, added_snapshot)`` are published (those that are)."""
        c = t.iceberg_vectors.c
        out: dict[tuple[int, int], PublishedVector] = {}
        by_file: dict[int, set[int]] = {}
        for fid, snap in keys:
            by_file.setdefault(int(fid), set()).add(int(snap))
        ids = sorted(by_file)
        with self._read() as conn:
            for start in range(0, len(ids), _CHUNK):
                for r in conn.execute(sa.select(
                        c.file_id, c.added_snapshot, c.path, c.blob_offset, c.blob_length,
                        c.file_size, c.copied).where(
                        (c.table_id == table_id) & c.file_id.in_(ids[start:start + _CHUNK]))):
                    if int(r[1]) in by_file[int(r[0])]:
                        out[(int(r[0]), int(r[1]))] = PublishedVector(
                            int(r[0]), int(r[1]), r[2], int(r[3]), int(r[4]), int(r[5]),
                            bool(r[6]))
        return out

    def iceberg_file_paths(self, table_id: int, conn: Connection | None = None) -> list[str]:
        """Every file a publisher wrote and recorded for the table (metadata JSON, manifest
        lists, manifests, copies of deletion vectors), relative to its location."""
        queries = [
            sa.select(t.iceberg_metadata.c.path).where(t.iceberg_metadata.c.table_id == table_id),
            sa.select(t.iceberg_snapshots.c.manifest_list).where(
                t.iceberg_snapshots.c.table_id == table_id),
            sa.select(t.iceberg_manifests.c.path).where(
                t.iceberg_manifests.c.table_id == table_id),
            sa.select(t.iceberg_vectors.c.path).where(
                (t.iceberg_vectors.c.table_id == table_id) & (t.iceberg_vectors.c.copied == 1)),
        ]
        if conn is None:
            with self._read() as own:
                return [r[0] for q in queries for r in own.execute(q)]
        return [r[0] for q in queries for r in conn.execute(q)]

    # -- reading what to publish -----------------------------------------------------------

    def iceberg_snapshot_rows(self, table_id: int, conn: Connection | None = None
                              ) -> list[dict[str, Any]]:
        """The retained snapshots with what an Iceberg snapshot needs, oldest first."""
        s = t.snapshots.c
        with self._reading(conn) as conn:
            rows = conn.execute(sa.select(
                s.snapshot_id, s.parent_id, s.kind, s.committed_at, s.schema_id,
                s.added_files, s.removed_files, s.added_rows, s.removed_rows, s.total_files,
                s.total_rows, s.first_row_id).where(s.table_id == table_id)
                .order_by(s.snapshot_id)).all()
        return [dict(r._mapping) for r in rows]

    def iceberg_schema_times(self, table_id: int, conn: Connection | None = None) -> dict[int, int]:
        """Every schema version of the table and when it was created (epoch ms)."""
        c = t.schemas.c
        with self._reading(conn) as conn:
            return {int(r[0]): int(r[1]) for r in conn.execute(
                sa.select(c.schema_id, c.created_at).where(c.table_id == table_id))}

    def iceberg_tag_rows(self, table_id: int, conn: Connection | None = None
                         ) -> list[tuple[str, int, int]]:
        """``(name, snapshot_id, created_at)`` of every tag."""
        c = t.tags.c
        with self._reading(conn) as conn:
            return [(r[0], int(r[1]), int(r[2])) for r in conn.execute(
                sa.select(c.name, c.snapshot_id, c.created_at).where(c.table_id == table_id)
                .order_by(c.name))]

    def iceberg_file_schema_ids(self, table_id: int, snapshot_id: int | None = None,
                                conn: Connection | None = None) -> set[int]:
        """The schema ids data files were written in: of every file the table still records,
        or of the live files of ``snapshot_id``."""
        c = t.files.c
        where = (c.table_id == table_id) & (c.content == "data")
        if snapshot_id is not None:
            where = where & (c.added_snapshot <= snapshot_id) & (
                c.removed_snapshot.is_(None) | (c.removed_snapshot > snapshot_id))
        with self._reading(conn) as conn:
            return {int(r[0]) for r in conn.execute(
                sa.select(c.schema_id).distinct().where(where))}

    @staticmethod
    def _entry_columns() -> list[Any]:
        c = t.files.c
        return [c[f.name] for f in ENTRY_FILE_SCHEMA]

    def iceberg_files_delta(self, table_id: int, base: int | None, snapshot_id: int
                            ) -> tuple[pa.Table, list[int]]:
        """Between the published snapshot ``base`` (None: nothing) and ``snapshot_id``: the
        data files live in the second but not in the first (:data:`ENTRY_FILE_SCHEMA`), and
        the ids of those live in the first but not in the second. Snapshots form one chain
        whose ids grow, so both are ranges of the added and removed snapshot ids."""
        c = t.files.c
        low = -1 if base is None else base
        data = (c.table_id == table_id) & (c.content == "data")
        added = data & (c.added_snapshot > low) & (c.added_snapshot <= snapshot_id) & (
            c.removed_snapshot.is_(None) | (c.removed_snapshot > snapshot_id))
        removed = data & (c.added_snapshot <= low) & (c.removed_snapshot > low) & (
            c.removed_snapshot <= snapshot_id)
        with self._read() as conn:
            rows = conn.execute(sa.select(*self._entry_columns()).where(added)
                                .order_by(c.file_id)).all()
            gone = [int(r[0]) for r in conn.execute(sa.select(c.file_id).where(removed))]
        return rows_to_table(rows, ENTRY_FILE_SCHEMA), sorted(gone)

    def iceberg_files_by_id(self, table_id: int, file_ids: Sequence[int]) -> pa.Table:
        """The data files ``file_ids`` (:data:`ENTRY_FILE_SCHEMA`, ordered by id)."""
        c = t.files.c
        rows: list[Any] = []
        ids = sorted({int(i) for i in file_ids})
        with self._read() as conn:
            for start in range(0, len(ids), _CHUNK):
                rows += conn.execute(sa.select(*self._entry_columns()).where(
                    (c.table_id == table_id) & c.file_id.in_(ids[start:start + _CHUNK]))).all()
        rows.sort(key=lambda r: r[0])
        return rows_to_table(rows, ENTRY_FILE_SCHEMA)

    @staticmethod
    def _vector_row(r: Any) -> VectorRow:
        return VectorRow(int(r[0]), int(r[1]), int(r[2]), None if r[3] is None else bytes(r[3]),
                         r[4], r[5], r[6])

    def _vector_columns(self) -> list[Any]:
        v = t.vectors.c
        return [v.file_id, v.added_snapshot, v.cardinality, v.blob, v.puffin_path,
                v.blob_offset, v.blob_length]

    def iceberg_vectors_delta(self, table_id: int, base: int | None, snapshot_id: int
                              ) -> tuple[list[VectorRow], list[int]]:
        """As :meth:`iceberg_files_delta`, for deletion vectors: those live at
        ``snapshot_id`` and not at ``base``, and the data file ids of those live at ``base``
        and not at ``snapshot_id``."""
        v = t.vectors.c
        low = -1 if base is None else base
        added = (v.table_id == table_id) & (v.added_snapshot > low) & (
            v.added_snapshot <= snapshot_id) & (
            v.removed_snapshot.is_(None) | (v.removed_snapshot > snapshot_id))
        removed = (v.table_id == table_id) & (v.added_snapshot <= low) & (
            v.removed_snapshot > low) & (v.removed_snapshot <= snapshot_id)
        with self._read() as conn:
            rows = [self._vector_row(r) for r in conn.execute(
                sa.select(*self._vector_columns()).where(added).order_by(v.file_id))]
            gone = [int(r[0]) for r in conn.execute(sa.select(v.file_id).where(removed))]
        return rows, sorted(gone)

    def iceberg_vectors_of(self, table_id: int, snapshot_id: int, file_ids: Sequence[int]
                           ) -> list[VectorRow]:
        """The vectors of data files ``file_ids`` live at ``snapshot_id``."""
        v = t.vectors.c
        ids = sorted({int(i) for i in file_ids})
        out: list[VectorRow] = []
        with self._read() as conn:
            for start in range(0, len(ids), _CHUNK):
                out += [self._vector_row(r) for r in conn.execute(
                    sa.select(*self._vector_columns()).where(
                        (v.table_id == table_id) & v.file_id.in_(ids[start:start + _CHUNK])
                        & (v.added_snapshot <= snapshot_id)
                        & (v.removed_snapshot.is_(None) | (v.removed_snapshot > snapshot_id))))]
        out.sort(key=lambda r: r.file_id)
        return out

    # -- recording ---------------------------------------------------------------------------

    def record_iceberg_publication(self, table_id: int, new: NewPublication) -> None:
        """Record ``new`` in one transaction, if nothing was recorded for the table since the
        state it was planned on (``expected_version``); else :class:`PublicationRace` (nothing
        is recorded). The write that wrote its files must still be registered."""
        try:
            with self._write() as conn:
                self._record_publication(conn, table_id, new)
        except IntegrityError as exc:
            # A row another publisher recorded meanwhile (or the table was dropped: the next
            # attempt finds out).
            raise PublicationRace(str(exc)) from exc

    def _record_publication(self, conn: Connection, table_id: int,
                            new: NewPublication) -> None:
        c = t.iceberg_tables.c
        exists = conn.execute(sa.select(t.tables.c.table_id).where(
            t.tables.c.table_id == table_id)).first()
        if exists is None:
            raise self._dropped(table_id)
        if new.write_id is not None:
            InflightWrites.check_registered(conn, new.write_id)
        now = now_ms()
        row = conn.execute(sa.select(c.version).where(c.table_id == table_id)
                           .with_for_update()).first()
        version = None if row is None else int(row[0])
        if version != new.expected_version:
            raise PublicationRace(f"another publication was recorded (version {version})")
        m = t.iceberg_manifests.c
        if new.snapshots:
            conn.execute(t.iceberg_snapshots.insert(), [
                dict(table_id=table_id, snapshot_id=s, manifest_list=p, published_at=now)
                for s, p in new.snapshots.items()])
        if new.manifests:
            conn.execute(t.iceberg_manifests.insert(), [
                dict(table_id=table_id, removed_snapshot=None, **vars(r))
                for r in new.manifests])
        # After the inserts: a manifest written by this publication may be replaced by a
        # later snapshot of the same publication.
        for path, snapshot in new.removed_manifests.items():
            res = conn.execute(t.iceberg_manifests.update().where(
                (m.table_id == table_id) & (m.path == path) & m.removed_snapshot.is_(None))
                .values(removed_snapshot=snapshot))
            if res.rowcount != 1:
                raise PublicationRace(f"manifest {path} was replaced meanwhile")
        if new.vectors:
            conn.execute(t.iceberg_vectors.insert(), [
                dict(table_id=table_id, file_id=v.file_id, added_snapshot=v.added_snapshot,
                     path=v.path, blob_offset=v.offset, blob_length=v.length,
                     file_size=v.file_size, copied=int(v.copied)) for v in new.vectors])
        if not new.metadata_exists:
            conn.execute(t.iceberg_metadata.insert().values(
                table_id=table_id, path=new.metadata_path, snapshot_id=new.metadata_snapshot,
                snapshot_ids=json.dumps(sorted(int(s) for s in new.listed)),
                content_hash=new.content_hash, published_at=now))
        values: dict[str, Any] = {"version": (version or 0) + 1, "published_at": now}
        if new.make_current:
            values.update(metadata_path=new.metadata_path, snapshot_id=new.metadata_snapshot)
        if row is None:
            values.setdefault("metadata_path", None)
            conn.execute(t.iceberg_tables.insert().values(table_id=table_id, **values))
        else:
            conn.execute(t.iceberg_tables.update().where(c.table_id == table_id)
                         .values(**values))

    # -- expiry ------------------------------------------------------------------------------

    def expire_iceberg(self, table_id: int) -> list[str]:
        """Forget what only expired snapshots used, after :meth:`expire_snapshots`: their
        manifest lists, the metadata listing any of them, manifests no retained snapshot
        uses, copies of vectors whose rows are gone, and superseded metadata of the same
        snapshot. The files to delete, relative to the table's location."""
        s = t.snapshots.c
        retained = sa.select(s.snapshot_id).where(s.table_id == table_id)
        paths: list[str] = []
        with self._write() as conn:
            self._check_exists(conn, table_id)
            sn = t.iceberg_snapshots.c
            gone = (sn.table_id == table_id) & sn.snapshot_id.not_in(retained)
            paths += [r[0] for r in conn.execute(sa.select(sn.manifest_list).where(gone))]
            conn.execute(t.iceberg_snapshots.delete().where(gone))

            m = t.iceberg_manifests.c
            used = sa.exists().where((s.table_id == m.table_id)
                                     & (s.snapshot_id >= m.added_snapshot)
                                     & (s.snapshot_id < m.removed_snapshot))
            unused = (m.table_id == table_id) & m.removed_snapshot.is_not(None) & ~used
            paths += [r[0] for r in conn.execute(sa.select(m.path).where(unused))]
            conn.execute(t.iceberg_manifests.delete().where(unused))

            v, iv = t.vectors.c, t.iceberg_vectors.c
            kept = sa.exists().where((v.table_id == iv.table_id) & (v.file_id == iv.file_id)
                                     & (v.added_snapshot == iv.added_snapshot))
            orphaned = (iv.table_id == table_id) & ~kept
            paths += [r[0] for r in conn.execute(sa.select(iv.path).where(
                orphaned & (iv.copied == 1)))]
            conn.execute(t.iceberg_vectors.delete().where(orphaned))

            paths += self._expire_metadata(conn, table_id)
        return paths

    def _check_exists(self, conn: Connection, table_id: int) -> None:
        if conn.execute(sa.select(t.tables.c.table_id).where(
                t.tables.c.table_id == table_id)).first() is None:
            raise self._dropped(table_id)

    @staticmethod
    def _expire_metadata(conn: Connection, table_id: int) -> list[str]:
        """Delete the metadata listing an expired snapshot (it would refer to its deleted
        manifest list) and, per snapshot, all but the newest. The table's current metadata
        is kept unless it lists an expired snapshot: then the table has none until the next
        publication (the maintenance service publishes right after it expires)."""
        md, cur = t.iceberg_metadata.c, t.iceberg_tables.c
        retained = {int(r[0]) for r in conn.execute(sa.select(t.snapshots.c.snapshot_id).where(
            t.snapshots.c.table_id == table_id))}
        head = conn.execute(sa.select(cur.metadata_path, cur.version).where(
            cur.table_id == table_id).with_for_update()).first()
        current = None if head is None else head[0]
        rows = conn.execute(sa.select(md.path, md.snapshot_id, md.snapshot_ids).where(
            md.table_id == table_id).order_by(md.published_at.desc(), md.path)).all()
        newest: set[int | None] = set()
        drop: list[str] = []
        for path, snapshot, listed in rows:
            expired = not retained.issuperset(json.loads(listed))
            superseded = snapshot in newest or (snapshot is None and bool(retained))
            newest.add(snapshot)
            if expired or (superseded and path != current):
                drop.append(path)
        for start in range(0, len(drop), _CHUNK):
            conn.execute(t.iceberg_metadata.delete().where(
                (md.table_id == table_id) & md.path.in_(drop[start:start + _CHUNK])))
        if head is not None and current in drop:
            conn.execute(t.iceberg_tables.update().where(cur.table_id == table_id).values(
                metadata_path=None, snapshot_id=None, version=int(head[1]) + 1,
                published_at=now_ms()))
        return drop
