"""A table as the code below the facade sees it: its record, metastore, storage and views.

Writes, key lookups, changelogs and maintenance take a :class:`TableState`, never the
:class:`~arrowlake.table.table.Table` facade, so the facade can compose them without the
circle of imports that reaching back into it made. A state detached from the metastore (its
record, storage and schema only; picklable) is what workers of an engine write with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from arrowlake.errors import MetastoreError, ReadOnlyLake
from arrowlake.io.storage import discard_after_failure
from arrowlake.io.writer import FileTarget, WriteOptions
from arrowlake.metastore.store import Metastore, NewFile, TableRecord, check_commit_id
from arrowlake.scan.planning import TableView
from arrowlake.scan.split import MergeSpec
from arrowlake.table.options.primary_key import merge_engine, sequence_field

if TYPE_CHECKING:
    from arrowlake.io.storage import Storage


class Catalog(Protocol):
    """What a table needs from the lake that holds it (an :class:`arrowlake.Lake`, a layer
    above, which creates tables)."""

    @property
    def metastore(self) -> Metastore: ...

    def storage_for(self, location: str) -> Storage: ...


class TableState:
    """One table's record (reloaded by :meth:`refresh`), the metastore holding it and the
    storage of its files.

    ``TableState.detached(record, storage, schema)`` has no metastore: it can be pickled to a
    worker that writes files for a commit made elsewhere.
    """

    def __init__(self, catalog: Catalog | None, record: TableRecord, *,
                 storage: Storage | None = None, schema: pa.Schema | None = None) -> None:
        self._catalog = catalog
        self.record = record
        self._fixed_storage = storage
        self._fixed_schema = schema

    @classmethod
    def detached(cls, record: TableRecord, storage: Storage, schema: pa.Schema) -> TableState:
        return cls(None, record, storage=storage, schema=schema)

    def __getstate__(self) -> dict[str, object]:
        # Only a detached state travels: a worker has no metastore connection to carry.
        return {"record": self.record, "storage": self.storage, "schema": self.schema}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._catalog = None
        self.record = state["record"]  # type: ignore[assignment]
        self._fixed_storage = state["storage"]  # type: ignore[assignment]
        self._fixed_schema = state["schema"]

    # -- what the table is ---------------------------------------------------------------------

    @property
    def metastore(self) -> Metastore:
        if self._catalog is None:
            raise MetastoreError(
                f"Table {self.name} is held detached from its metastore here (a worker's copy): "
                "only the process that commits reads and writes the metastore")
        return self._catalog.metastore

    @property
    def storage(self) -> Storage:
        if self._fixed_storage is not None:
            return self._fixed_storage
        assert self._catalog is not None
        return self._catalog.storage_for(self.record.location)

    @property
    def catalog(self) -> Catalog | None:
        return self._catalog

    @property
    def name(self) -> str:
        return self.record.full_name

    @property
    def table_id(self) -> int:
        return self.record.table_id

    @property
    def schema(self) -> pa.Schema:
        """The current schema (fields carry their ids in metadata)."""
        if self._fixed_schema is not None:
            return self._fixed_schema
        return self.metastore.schema(self.record.table_id, self.record.current_schema_id)

    @property
    def current_snapshot_id(self) -> int | None:
        """The latest snapshot id, read from the metastore on each access."""
        return self.metastore.current_snapshot_id(self.record.table_id)

    def refresh(self) -> TableState:
        """Reload the record (schema, properties, current snapshot) from the metastore."""
        if self._catalog is not None:
            self.record = self.metastore.load_table_by_id(self.record.table_id)
        return self

    def check_write(self, commit_id: str | None = None) -> None:
        """Refuse a write up front, before any data file is written: a commit id no metastore
        can store, or a lake opened read-only."""
        check_commit_id(commit_id)
        if self.metastore.read_only:
            raise ReadOnlyLake(
                f"Cannot write to table {self.name}: the lake was opened read-only (its "
                f"metastore {self.metastore.location} cannot be written here)")

    # -- views ---------------------------------------------------------------------------------

    def view(self, snapshot_id: int | None, *, current_schema: bool = False,
             refreshed: bool = False) -> TableView:
        """The table at ``snapshot_id``, in the mode that snapshot was written in (and in its
        schema unless ``current_schema``, or it is the current snapshot). ``refreshed``: the
        record was just reloaded, so its current snapshot is the current one."""
        rec = self.record.as_of(snapshot_id)
        schema = self.schema
        if not current_schema and snapshot_id is not None:
            current = self.record.current_snapshot_id if refreshed \
                else self.current_snapshot_id
            if snapshot_id != current:
                schema_id = self.metastore.snapshot(rec.table_id, snapshot_id)["schema_id"]
                schema = self.metastore.schema(rec.table_id, schema_id)
        return TableView(self.metastore, self.storage, rec, snapshot_id, schema)

    def merge_spec(self, schema: pa.Schema | None = None,
                   record: TableRecord | None = None) -> MergeSpec | None:
        """How versions merge when files are read in ``schema`` (the current one by default);
        None when reads merge nothing: tables without a primary key, and primary-key tables
        with deletion vectors, whose writes leave one live row per key. ``record``: the
        table as of the snapshot read (its mode then; the current one by default)."""
        rec = self.record if record is None else record
        if not rec.primary_key or rec.deletion_vectors:
            return None
        return MergeSpec(tuple(self.record.primary_key), merge_engine(self, schema),
                         sequence_field(self, schema), tuple(self.record.partition_by))

    # -- files -------------------------------------------------------------------------------

    def file_target(self) -> FileTarget:
        """Where and how the table's data files are written now (its current schema)."""
        rec = self.record
        return FileTarget(storage=self.storage, location=rec.location, schema=self.schema,
                          schema_id=rec.current_schema_id,
                          options=WriteOptions.from_properties(rec.properties))

    def discard(self, files: Sequence[NewFile]) -> None:
        """Delete files written for a commit that did not happen. Called while the write's
        error propagates: a failure to delete is attached to that error rather than replacing
        it."""
        storage = self.storage
        discard_after_failure(storage, [storage.join(self.record.location, f.path)
                                        for f in files])
