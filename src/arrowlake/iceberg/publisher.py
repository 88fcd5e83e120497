"""Publishing a table's Iceberg v3 metadata, incrementally, and finding what was published.

A publication describes one snapshot (the current one by default) and the retained history
before it. Every retained snapshot with a view gets a manifest list once; a snapshot's
manifests are built from the previous published snapshot's as Iceberg's fast append builds
them (``_SnapshotBuilder``):

- the data files the snapshot added go into a new manifest (with ``DELETED`` entries for the
  files it removed); every other manifest is reused as it is, except those that lost a file,
  which are rewritten without it;
- the same for deletion vectors: a new delete manifest for the vectors the snapshot recorded,
  and the delete manifests holding a vector it replaced rewritten;
- once :data:`MERGE_MIN_COUNT` manifests of one content are smaller than
  :data:`MANIFEST_ENTRIES` entries, they are merged.

So a snapshot costs work proportional to what it changed (plus the rewrites and the occasional
merge), not to the table's size. Vectors are published one per Puffin file, since DuckDB 1.5.5
applies the wrong vector when a Puffin file holds several: a vector arrowlake keeps in a Puffin
file of its own is referenced in place, every other one (inline in the metastore, or sharing a
Puffin file with others) is copied into a Puffin file of its own, once.

Files are written first, under a registration of the write in flight
(:mod:`arrowlake.metastore.inflight`, so orphan removal leaves them alone), into the table's
``metadata/`` folder; then everything is recorded in one transaction that compare-and-swaps
the table's publication version (:mod:`arrowlake.metastore.iceberg`). A publisher that loses
that race deletes its files and plans again on what the winner recorded, which it mostly
reuses. Publishing what was published before writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from arrowlake.errors import (
    CommitConflict,
    NoIcebergView,
    ReadOnlyLake,
    SnapshotNotFound,
    ValidationError,
)
from arrowlake.iceberg import manifests as mf
from arrowlake.iceberg.metadata import content_hash, table_metadata
from arrowlake.iceberg.types import Unsupported
from arrowlake.iceberg.view import Describer, table_problem
from arrowlake.io import puffin
from arrowlake.io.deletion_vectors import BLOB_TYPE
from arrowlake.io.lru import SizedLRU
from arrowlake.io.storage import Storage, discard_after_failure
from arrowlake.metastore.iceberg import (
    IcebergState,
    ManifestRecord,
    NewPublication,
    PublicationRace,
    PublishedVector,
    VectorRow,
)
from arrowlake.metastore.inflight import new_file_name, registered_write
from arrowlake.metastore.records import check_snapshot_id
from arrowlake.table.maintenance.health import IcebergStatus

if TYPE_CHECKING:
    from arrowlake.metastore.store import Metastore, TableRecord
    from arrowlake.table.table import Table

#: Where a table's Iceberg metadata files go, below its location.
METADATA_FOLDER = "metadata"
#: Attempts of a publication that keeps losing races with other publishers.
ATTEMPTS = 10
#: Entries of one manifest written at once; manifests smaller than this are merged ...
MANIFEST_ENTRIES = 10_000
#: ... once there are this many of one content (Iceberg's commit.manifest.min-count-to-merge).
MERGE_MIN_COUNT = 100


@dataclass(frozen=True)
class Publication:
    """A published Iceberg view of a table: the metadata file a reader opens (an absolute
    path or URI), the snapshot it describes as current (None: the table has none yet) and the
    metadata JSON as written."""

    metadata_location: str
    snapshot_id: int | None
    metadata: dict[str, Any]


#: Metadata JSON read back, by absolute location (files are never rewritten).
_READ: SizedLRU[dict[str, Any]] = SizedLRU(32 * 1024 * 1024, lambda m: 1024 + 512 * len(
    m.get("snapshots", ())))


def _read_metadata(storage: Storage, location: str) -> dict[str, Any]:
    found = _READ.get(location)
    if found is None:
        found = json.loads(storage.read_bytes(location))
        _READ.put(location, found)
    return found


# -- what one attempt reads ---------------------------------------------------------------------


class _View:
    """The table and what is published for it, as one attempt of a publication reads them."""

    def __init__(self, table: Table, snapshot_id: int | None) -> None:
        table.refresh()
        self.rec: TableRecord = table._record
        self.metastore: Metastore = table._metastore
        self.storage = table._storage
        self.location = self.rec.location
        table_id = self.rec.table_id
        schema = table.schema
        problem = table_problem(self.rec, schema)
        if problem is not None:
            raise NoIcebergView(problem)
        current = self.rec.current_snapshot_id
        if snapshot_id is not None:
            snapshot_id = check_snapshot_id(snapshot_id)
        self.is_current = snapshot_id is None or snapshot_id == current
        self.target: int | None = current if self.is_current else snapshot_id
        self.spec = mf.partition_spec(schema, self.rec.partition_by)
        inputs = self.metastore.iceberg_inputs(table_id)
        self.state: IcebergState = inputs.state
        rows = inputs.snapshots
        self.by_id = {int(r["snapshot_id"]): r for r in rows}
        if self.target is not None and self.target not in self.by_id:
            raise SnapshotNotFound(
                f"Snapshot {self.target} does not exist (never committed, or expired)")
        self.describer = Describer(
            self.rec, lambda sid: self.metastore.schema(table_id, sid),
            lambda at: inputs.file_schema_ids if at is None else
            self.metastore.iceberg_file_schema_ids(table_id, at))
        if self.target is not None:
            why = self.describer.problem(self.by_id[self.target])
            if why is not None:
                raise NoIcebergView(why)
        head = self.state.head
        described = [r for r in rows if self.target is not None
                     and int(r["snapshot_id"]) <= self.target
                     and self.describer.problem(r) is None]
        self.to_build = [r for r in described if int(r["snapshot_id"]) not in self.state.snapshots
                         and (head is None or int(r["snapshot_id"]) > head)]
        if self.target is not None and self.target not in self.state.snapshots and \
                head is not None and self.target < head:
            raise NoIcebergView(
                f"Snapshot {self.target} of {self.rec.full_name} was not published when later "
                "ones were, so it cannot be published now")
        building = {int(r["snapshot_id"]) for r in self.to_build}
        self.listed = [r for r in described if int(r["snapshot_id"]) in self.state.snapshots
                       or int(r["snapshot_id"]) in building]
        self.schema_id = self.rec.current_schema_id if self.is_current or self.target is None \
            else int(self.by_id[self.target]["schema_id"])
        self.schema_times = inputs.schema_times
        schemas = {}
        for sid in self.schema_times:
            converted = self.describer.schema_json(sid)
            if sid <= self.schema_id and not isinstance(converted, Unsupported):
                schemas[sid] = converted
        self.schemas = schemas
        self.tags = inputs.tags

    def absolute(self, relative: str) -> str:
        return self.storage.join(self.location, relative)

    def metadata(self, manifest_lists: Mapping[int, str]) -> dict[str, Any]:
        """The metadata JSON, with the manifest lists (relative paths) of the snapshots."""
        target = self.by_id.get(self.target) if self.target is not None else None
        next_row_id = 0 if target is None else \
            int(target["first_row_id"] or 0) + int(target["added_rows"])
        return table_metadata(
            self.rec, self.location, listed=self.listed,
            manifest_lists={s: self.absolute(p) for s, p in manifest_lists.items()},
            schemas=self.schemas, schema_times=self.schema_times,
            current_schema_id=self.schema_id, spec=self.spec, tags=self.tags,
            next_row_id=next_row_id,
            last_column_id=self.rec.last_field_id if self.is_current else 0)


# -- building the manifests of a snapshot -------------------------------------------------------


@dataclass
class _Run:
    """What one publication writes, as it goes."""

    written: list[str] = field(default_factory=list)  # absolute paths, to delete on failure
    snapshots: dict[int, str] = field(default_factory=dict)
    manifests: list[ManifestRecord] = field(default_factory=list)
    removed: dict[str, int] = field(default_factory=dict)
    vectors: list[PublishedVector] = field(default_factory=list)


class _SnapshotBuilder:
    """Builds the manifests and manifest list of each snapshot to publish, from those of the
    previous one (see the module docs)."""

    def __init__(self, view: _View, run: _Run) -> None:
        self.view = view
        self.run = run
        self.metastore = view.metastore
        self.table_id = view.rec.table_id
        self.spec_key = mf.spec_hash(view.spec)
        self.live: dict[int, list[ManifestRecord]] = {mf.CONTENT_DATA: [],
                                                     mf.CONTENT_DELETES: []}
        for m in view.state.manifests:
            self.live[m.content].append(m)
        self.ids: dict[str, np.ndarray] = {}
        self.published: dict[tuple[int, int], PublishedVector] = {}
        self._partitions: dict[int, list[Any]] | None = None
        self._footers: dict[str, int] = {}
        self.base: int | None = view.state.head

    # -- reading ----------------------------------------------------------------------------

    def _partition_values(self, partition_id: int | None) -> list[Any]:
        if self._partitions is None:
            self._partitions = {pid: json.loads(values) for pid, _, values in
                                self.metastore.partitions(self.table_id)}
        stored = None if partition_id is None else self._partitions.get(int(partition_id))
        return self.view.spec.values(stored)

    def _manifest_ids(self, manifests: Sequence[ManifestRecord]) -> None:
        missing = [m.path for m in manifests if m.path not in self.ids]
        if missing:
            self.ids.update(self.metastore.iceberg_manifest_ids(self.table_id, missing))

    def _affected(self, content: int, gone: np.ndarray) -> list[ManifestRecord]:
        """The live manifests of ``content`` holding any of the (sorted) ids ``gone``."""
        if not len(gone):
            return []
        candidates = []
        for m in self.live[content]:
            if m.min_file_id is None or m.max_file_id is None:
                continue
            lo, hi = np.searchsorted(gone, [m.min_file_id, m.max_file_id + 1])
            if lo < hi:
                candidates.append(m)
        self._manifest_ids(candidates)
        return [m for m in candidates if np.isin(self.ids[m.path], gone).any()]

    # -- entries ----------------------------------------------------------------------------

    def _data_entries(self, rows: pa.Table, snapshot: int, status: int | None = None
                      ) -> list[dict[str, Any]]:
        """An entry per data file row (see :func:`_entry`); the status is ``ADDED`` for files
        the snapshot added, else ``EXISTING`` (or ``status``)."""
        out = []
        schemas: dict[int, pa.Schema] = {}
        for row in rows.to_pylist():
            sid = int(row["schema_id"])
            schema = schemas.get(sid)
            if schema is None:
                schema = schemas[sid] = self.metastore.schema(self.table_id, sid)
            values = self._partition_values(row["partition_id"])
            record = mf.data_file_record(row, self.view.absolute(row["path"]), schema,
                                         mf.partition_record(self.view.spec, values))
            added = int(row["added_snapshot"])
            st = status if status is not None else (
                mf.STATUS_ADDED if added == snapshot else mf.STATUS_EXISTING)
            entry_snapshot = snapshot if st == mf.STATUS_DELETED else added
            out.append(_entry(mf.entry(st, entry_snapshot, added, record),
                              row["partition_id"], int(row["file_id"]), values))
        return out

    def _publish_vector(self, v: VectorRow, data_path: str) -> PublishedVector:
        """Where vector ``v`` is published: its own Puffin file if it has one alone, else a
        copy (a Puffin file of its own), written now."""
        storage = self.view.storage
        if v.puffin_path is not None and v.blob_offset is not None and \
                v.blob_length is not None:
            path = self.view.absolute(v.puffin_path)
            if path not in self._footers:
                self._footers[path] = len(puffin.read_footer(storage, path))
            if self._footers[path] == 1:
                size = storage.file_size(path)
                if size is not None:
                    return PublishedVector(v.file_id, v.added_snapshot, v.puffin_path,
                                           v.blob_offset, v.blob_length, size, False)
            blob = puffin.read_blob(storage, puffin.BlobLocation(path, v.blob_offset,
                                                                 v.blob_length))
        elif v.blob is not None:
            blob = v.blob
        else:
            raise CommitConflict(f"The deletion vector of data file {v.file_id} has neither "
                                 "bytes nor a Puffin file in the metastore")
        relative = f"{METADATA_FOLDER}/{new_file_name('puffin')}"
        target = self.view.absolute(relative)
        self.run.written.append(target)
        (at,) = puffin.write_puffin(storage, target, [puffin.Blob(
            blob, BLOB_TYPE, {"referenced-data-file": data_path,
                              "cardinality": str(v.cardinality)})])
        size = storage.file_size(target)
        if size is None:
            raise CommitConflict(f"The Puffin file {target} just written cannot be found")
        return PublishedVector(v.file_id, v.added_snapshot, relative, at.offset, at.length,
                               size, True)

    def _vector_entries(self, vectors: Sequence[VectorRow], snapshot: int
                        ) -> list[dict[str, Any]]:
        if not vectors:
            return []
        files = self.metastore.iceberg_files_by_id(self.table_id, [v.file_id for v in vectors])
        by_id = {r["file_id"]: r for r in files.to_pylist()}
        keys = [(v.file_id, v.added_snapshot) for v in vectors]
        known = {k: self.published[k] for k in keys if k in self.published}
        lookup = [k for k in keys if k not in known]
        if lookup:
            known.update(self.metastore.iceberg_vectors(self.table_id, lookup))
        out = []
        for v in vectors:
            row = by_id[v.file_id]
            data_path = self.view.absolute(row["path"])
            at = known.get((v.file_id, v.added_snapshot))
            if at is None:
                at = self._publish_vector(v, data_path)
                self.published[(v.file_id, v.added_snapshot)] = at
                self.run.vectors.append(at)
            values = self._partition_values(row["partition_id"])
            record = mf.vector_record(self.view.absolute(at.path), at.file_size, at.offset,
                                      at.length, v.cardinality, data_path,
                                      mf.partition_record(self.view.spec, values))
            status = mf.STATUS_ADDED if v.added_snapshot == snapshot else mf.STATUS_EXISTING
            out.append(_entry(mf.entry(status, v.added_snapshot, v.added_snapshot, record),
                              row["partition_id"], v.file_id, values))
        return out

    def _existing(self, content: int, file_ids: np.ndarray, snapshot: int
                  ) -> list[dict[str, Any]]:
        """Entries of live files (or their live vectors) ``file_ids``, as ``snapshot`` has
        them."""
        if not len(file_ids):
            return []
        if content == mf.CONTENT_DATA:
            rows = self.metastore.iceberg_files_by_id(self.table_id, file_ids.tolist())
            return self._data_entries(rows, snapshot)
        vectors = self.metastore.iceberg_vectors_of(self.table_id, snapshot, file_ids.tolist())
        return self._vector_entries(vectors, snapshot)

    # -- one snapshot -----------------------------------------------------------------------

    def build(self, snapshot: Mapping[str, Any]) -> None:
        k = int(snapshot["snapshot_id"])
        base = self.base
        stale = [m for c in self.live.values() for m in c if m.spec_key != self.spec_key]
        if stale:  # the partition spec changed: every manifest is written again
            for m in stale:
                self.run.removed[m.path] = k
            self.live = {mf.CONTENT_DATA: [], mf.CONTENT_DELETES: []}
            base = None
        # Manifests holding only DELETED entries were for their own snapshot only.
        for kept in self.live.values():
            for m in [m for m in kept if m.min_file_id is None]:
                self.run.removed[m.path] = k
                kept.remove(m)
        added, gone_ids = self.metastore.iceberg_files_delta(self.table_id, base, k)
        vectors, gone_vectors = self.metastore.iceberg_vectors_delta(self.table_id, base, k)
        gone = np.array(gone_ids, dtype=np.int64)
        drafts = {
            mf.CONTENT_DATA: self._data_drafts(k, added, gone),
            mf.CONTENT_DELETES: self._delete_drafts(k, vectors,
                                                    np.array(gone_vectors, dtype=np.int64)),
        }
        schema_json = self.view.describer.schema_json(int(snapshot["schema_id"]))
        assert not isinstance(schema_json, Unsupported)
        first_row_id = snapshot["first_row_id"]
        new: list[ManifestRecord] = []
        for content, pending in drafts.items():
            pending += self._merge(content, pending, k)
            for draft in pending:
                if not draft.entries:
                    continue
                relative = f"{METADATA_FOLDER}/{new_file_name('m.avro')}"
                for e in draft.entries:
                    for key in _PRIVATE:
                        e.pop(key, None)
                data, record = mf.write_manifest(
                    draft, self.view.spec, schema_json, int(snapshot["schema_id"]), k,
                    None if first_row_id is None else int(first_row_id), relative)
                self._write(relative, data)
                self.ids[relative] = record.ids()
                new.append(record)
                self.live[content].append(record)
        self.run.manifests += new
        listed = [*new, *(m for c in self.live.values() for m in c if m not in new)]
        relative = f"{METADATA_FOLDER}/{new_file_name(f'snap-{k}.avro')}"
        self._write(relative, mf.write_manifest_list(
            [(m, self.view.absolute(m.path)) for m in listed], k, snapshot["parent_id"],
            None if first_row_id is None else int(first_row_id)))
        self.run.snapshots[k] = relative
        self.base = k

    def _write(self, relative: str, data: bytes) -> None:
        path = self.view.absolute(relative)
        self.run.written.append(path)
        with self.view.storage.open_output(path) as out:
            out.write(data)

    def _drop(self, content: int, manifests: Sequence[ManifestRecord], k: int) -> None:
        for m in manifests:
            self.run.removed[m.path] = k
            self.live[content].remove(m)

    def _data_drafts(self, k: int, added: pa.Table, gone: np.ndarray) -> list[mf.ManifestDraft]:
        affected = self._affected(mf.CONTENT_DATA, gone)
        self._drop(mf.CONTENT_DATA, affected, k)
        drafts = []
        for m in affected:  # rewritten without the files they lost
            ids = self.ids[m.path]
            kept = ids[~np.isin(ids, gone)]
            drafts += _chunks(mf.CONTENT_DATA, self._existing(mf.CONTENT_DATA, kept, k))
        entries = self._data_entries(added, k)
        deleted = self._data_entries(
            self.metastore.iceberg_files_by_id(self.table_id, gone.tolist()), k,
            mf.STATUS_DELETED) if len(gone) else []
        new = _chunks(mf.CONTENT_DATA, entries)
        if deleted:
            if not new:
                new = [mf.ManifestDraft(mf.CONTENT_DATA, [], [], [])]
            new[0].entries += deleted
            new[0].partition_tuples += [e["_values"] for e in deleted]
        return new + drafts

    def _delete_drafts(self, k: int, vectors: Sequence[VectorRow], gone: np.ndarray
                       ) -> list[mf.ManifestDraft]:
        gone = np.unique(gone)
        affected = self._affected(mf.CONTENT_DELETES, gone)
        self._drop(mf.CONTENT_DELETES, affected, k)
        drafts = []
        for m in affected:
            ids = self.ids[m.path]
            kept = ids[~np.isin(ids, gone)]
            drafts += _chunks(mf.CONTENT_DELETES, self._existing(mf.CONTENT_DELETES, kept, k))
        return _chunks(mf.CONTENT_DELETES, self._vector_entries(vectors, k)) + drafts

    def _merge(self, content: int, pending: list[mf.ManifestDraft], k: int
               ) -> list[mf.ManifestDraft]:
        """Merge the small manifests of ``content`` (the live ones and ``pending``, which are
        emptied into the merged ones) once there are :data:`MERGE_MIN_COUNT` of them; the
        merged drafts."""
        small = [m for m in self.live[content]
                 if m.added_files + m.existing_files < MANIFEST_ENTRIES]
        small_drafts = [d for d in pending if len(d.entries) < MANIFEST_ENTRIES]
        if len(small) + len(small_drafts) < MERGE_MIN_COUNT:
            return []
        self._drop(content, small, k)
        self._manifest_ids(small)
        ids = np.concatenate([self.ids[m.path] for m in small]) if small else \
            np.zeros(0, dtype=np.int64)
        entries = self._existing(content, np.sort(ids), k)
        for d in small_drafts:
            entries += d.entries
            d.entries, d.file_ids, d.partition_tuples = [], [], []
        return _chunks(content, entries)


#: What an entry carries for the builder only (never written).
_PRIVATE = ("_partition", "_file_id", "_values")


def _entry(entry: dict[str, Any], partition_id: int | None, file_id: int, values: list[Any]
           ) -> dict[str, Any]:
    """A manifest entry with what the builder orders and summarizes it by: its partition,
    its data file and its partition tuple."""
    entry["_partition"] = -1 if partition_id is None else int(partition_id)
    entry["_file_id"] = file_id
    entry["_values"] = values
    return entry


def _chunks(content: int, entries: list[dict[str, Any]]) -> list[mf.ManifestDraft]:
    """``entries`` ordered by partition and file, in manifests of at most
    :data:`MANIFEST_ENTRIES` (files of a partition together, for pruning)."""
    entries = sorted(entries, key=lambda e: (e["_partition"], e["_file_id"]))
    out = []
    for start in range(0, len(entries), MANIFEST_ENTRIES):
        part = entries[start:start + MANIFEST_ENTRIES]
        out.append(mf.ManifestDraft(
            content, part,
            [e["_file_id"] for e in part if e["status"] != mf.STATUS_DELETED],
            [e["_values"] for e in part]))
    return out


# -- publishing ---------------------------------------------------------------------------------


def publish(table: Table, snapshot_id: int | None = None) -> Publication:
    """Publish the table's Iceberg v3 metadata as of ``snapshot_id`` (the current snapshot by
    default), writing only what is not published yet, and return it. Idempotent: the same
    state gives the same publication, written once. Safe with other publishers at once.

    Raises :class:`~arrowlake.errors.NoIcebergView` when the table (or that snapshot) has no
    Iceberg view, :class:`~arrowlake.errors.ReadOnlyLake` when something must be written and
    the lake is read-only here.

    >>> location = arrowlake.iceberg.publish(users).metadata_location  # doctest: +SKIP
    """
    for _ in range(ATTEMPTS):
        view = _View(table, snapshot_id)
        found = _already_published(view)
        if found is not None and (not view.is_current or view.state.current_path == found):
            return Publication(view.absolute(found), view.target,
                               _read_metadata(view.storage, view.absolute(found)))
        if view.metastore.read_only:
            raise ReadOnlyLake(
                f"Table {view.rec.full_name} has no Iceberg metadata published for "
                f"{'its current state' if view.is_current else f'snapshot {view.target}'}, and "
                f"the lake's metastore {view.metastore.location} is read-only here: publish it "
                f"where the lake may be written ('arrowlake iceberg {view.rec.full_name}')")
        try:
            return _publish_once(view, found)
        except PublicationRace:
            continue
    raise CommitConflict(
        f"Publishing the Iceberg metadata of {table.name} lost {ATTEMPTS} races with other "
        "publishers in a row; nothing of this attempt was kept. Try again")


def _already_published(view: _View) -> str | None:
    """The metadata file already recorded for this exact view, if there is nothing to build."""
    if view.to_build:
        return None
    metadata = view.metadata(view.state.snapshots)
    return view.metastore.iceberg_metadata_path(view.rec.table_id,
                                                content_hash=content_hash(metadata))


def _publish_once(view: _View, found: str | None) -> Publication:
    table_id = view.rec.table_id
    storage = view.storage
    run = _Run()
    with registered_write(view.metastore, table_id, "iceberg") as write_id:
        try:
            if found is None:
                builder = _SnapshotBuilder(view, run)
                for snapshot in view.to_build:
                    builder.build(snapshot)
                lists = {**view.state.snapshots, **run.snapshots}
                metadata = view.metadata(lists)
                path = f"{METADATA_FOLDER}/{new_file_name('metadata.json')}"
                data = json.dumps(metadata, indent=1).encode()
                run.written.append(view.absolute(path))
                with storage.open_output(view.absolute(path)) as out:
                    out.write(data)
                _READ.put(view.absolute(path), metadata)
                exists = False
            else:  # written before; only the table's current metadata changes
                path, exists = found, True
                metadata = _read_metadata(storage, view.absolute(found))
            view.metastore.record_iceberg_publication(table_id, NewPublication(
                expected_version=view.state.version, metadata_path=path,
                metadata_snapshot=view.target, content_hash=content_hash(metadata),
                listed=[int(s["snapshot-id"]) for s in metadata["snapshots"]],
                make_current=view.is_current, write_id=write_id, snapshots=run.snapshots,
                manifests=run.manifests, removed_manifests=run.removed, vectors=run.vectors,
                metadata_exists=exists))
        except PublicationRace:
            storage.delete(run.written)
            raise
        except BaseException:
            discard_after_failure(storage, run.written)
            raise
    return Publication(view.absolute(path), view.target, metadata)


def published(table: Table, snapshot_id: int | None = None) -> Publication | None:
    """What was published for the table, without writing anything (for read-only lakes):
    its current Iceberg metadata, or the newest one published for ``snapshot_id``; None when
    nothing was. Raises :class:`~arrowlake.errors.NoIcebergView` when the table has no view
    as it is now (a view published before it changed would misdescribe it)."""
    table.refresh()
    rec = table._record
    problem = table_problem(rec, table.schema)
    if problem is not None:
        raise NoIcebergView(problem)
    metastore = table._metastore
    storage = table._storage
    if snapshot_id is None or snapshot_id == rec.current_snapshot_id:
        current = metastore.iceberg_current(rec.table_id)
        if current is not None and (snapshot_id is None or current[1] == snapshot_id):
            location = storage.join(rec.location, current[0])
            return Publication(location, current[1], _read_metadata(storage, location))
        if snapshot_id is None:
            return None
    path = metastore.iceberg_metadata_path(rec.table_id, snapshot_id=snapshot_id)
    if path is None:
        return None
    location = storage.join(rec.location, path)
    return Publication(location, snapshot_id, _read_metadata(storage, location))



#: The table property that makes ``arrowlake maintain`` keep a table's Iceberg metadata
#: current ("true" or "false"; default false: published on demand only).
PUBLISH_PROPERTY = "iceberg.publish"


def publish_on_maintain(properties: Mapping[str, str]) -> bool:
    """Whether the table opted in to :data:`PUBLISH_PROPERTY`; a value other than true or
    false is a :class:`~arrowlake.errors.ValidationError` naming the property."""
    value = str(properties.get(PUBLISH_PROPERTY, "false")).strip().lower()
    if value not in ("true", "false"):
        raise ValidationError(f"Table property '{PUBLISH_PROPERTY}' must be 'true' or 'false', "
                              f"not {properties[PUBLISH_PROPERTY]!r}")
    return value == "true"


def view_status(table: Table) -> IcebergStatus:
    """Whether the table has an Iceberg view as it is now, and what is published of it."""
    rec = table._record
    problem = table_problem(rec, table.schema)
    snapshot = rec.current_snapshot_id
    if problem is None and snapshot is not None:
        metastore = table._metastore
        describer = Describer(rec, lambda sid: metastore.schema(rec.table_id, sid),
                              lambda at: metastore.iceberg_file_schema_ids(rec.table_id, at))
        problem = describer.problem(metastore.snapshot(rec.table_id, snapshot))
    current = table._metastore.iceberg_current(rec.table_id)
    published_snapshot = None if current is None else current[1]
    try:
        opted = publish_on_maintain(rec.properties)
    except ValidationError:
        opted = False
    return IcebergStatus(view=problem is None, reason=problem,
                         published_snapshot=published_snapshot,
                         current=current is not None and published_snapshot == snapshot,
                         publish_on_maintain=opted)
