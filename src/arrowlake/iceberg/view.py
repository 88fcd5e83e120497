"""Which tables and snapshots have an Iceberg view, and why not.

A table has one when Iceberg readers, reading its files with Iceberg's rules alone, see the
rows arrowlake sees:

- tables without a primary key, and primary-key tables with deletion vectors (one live row per
  key: older versions are positions in the vectors, which Iceberg v3 applies as they are);
- not merge-on-read primary-key tables, whose files hold several versions of a key that only
  arrowlake's merge resolves;
- every column of a type Iceberg v3 has (:mod:`arrowlake.iceberg.types`);
- and, per snapshot, every live file's columns readable as the snapshot's types: arrowlake
  widens int to float64, which Iceberg does not promote, so a snapshot whose files still hold
  the narrower type has no view until they are rewritten.

A snapshot of a deletion-vector table written before the table was switched to deletion
vectors is left out of the published history (it has no view); later ones are in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from arrowlake.iceberg.types import (
    IcebergType,
    Unsupported,
    iceberg_type,
    promotes,
    schema_json,
)
from arrowlake.metastore.records import DELETION_VECTORS_PROPERTY, TableRecord
from arrowlake.schema import field_id


def merge_on_read_problem(rec: TableRecord) -> str:
    return (
        f"Table {rec.full_name} is a merge-on-read primary-key table: its files hold several "
        "versions of a key, which only arrowlake's merge on read resolves, so it has no "
        "Iceberg view. Switch it to deletion vectors to give it one: table.compact(full=True), "
        f"then table.set_properties(**{{'{DELETION_VECTORS_PROPERTY}': 'true'}}) (on the "
        f"command line: arrowlake compact {rec.full_name} --full)")


def type_problem(rec: TableRecord, error: Unsupported, what: str = "") -> str:
    return (f"Table {rec.full_name}{what} has no Iceberg view: {error}. Drop or change that "
            "column (a type change needs its files rewritten) to give it one")


def table_problem(rec: TableRecord, schema: pa.Schema) -> str | None:
    """Why the table, as it is now, has no Iceberg view (None: it has one)."""
    if rec.primary_key and not rec.deletion_vectors:
        return merge_on_read_problem(rec)
    try:
        schema_json(schema, rec.current_schema_id, rec.primary_key)
    except Unsupported as exc:
        return type_problem(rec, exc)
    return None


class Describer:
    """Decides, per snapshot, whether it has an Iceberg view; keeps the schema conversions
    (each schema version once)."""

    def __init__(self, rec: TableRecord, schema_of: Callable[[int], pa.Schema],
                 file_schema_ids: Callable[[int | None], set[int]]) -> None:
        self.rec = rec
        self._schema_of = schema_of
        self._file_schema_ids = file_schema_ids
        self._json: dict[int, dict[str, Any] | Unsupported] = {}
        self._types: dict[int, dict[int, IcebergType | Unsupported]] = {}
        self._conflicts: dict[int, set[int]] = {}
        self._all_file_schemas: set[int] | None = None

    def schema_json(self, schema_id: int) -> dict[str, Any] | Unsupported:
        found = self._json.get(schema_id)
        if found is None:
            try:
                found = schema_json(self._schema_of(schema_id), schema_id, self.rec.primary_key)
            except Unsupported as exc:
                found = exc
            self._json[schema_id] = found
        return found

    def _field_types(self, schema_id: int) -> dict[int, IcebergType | Unsupported]:
        found = self._types.get(schema_id)
        if found is None:
            found = {}
            for f in self._schema_of(schema_id):
                try:
                    found[field_id(f)] = iceberg_type(f.type, f.name)
                except Unsupported as exc:
                    found[field_id(f)] = exc
            self._types[schema_id] = found
        return found

    def _unreadable(self, file_schema: int, schema_id: int) -> str | None:
        """Why files written in ``file_schema`` cannot be read as ``schema_id`` by Iceberg
        readers (None: they can)."""
        if file_schema == schema_id:
            return None
        old, new = self._field_types(file_schema), self._field_types(schema_id)
        names = {field_id(f): f.name for f in self._schema_of(schema_id)}
        for fid, typ in new.items():
            before = old.get(fid)
            if before is None or isinstance(typ, Unsupported):
                continue
            if isinstance(before, Unsupported):
                return (f"files written before column '{names[fid]}' became {typ} still "
                        f"hold it as {before.type}, which Iceberg lacks")
            if not promotes(before, typ):
                return (f"files written before column '{names[fid]}' became {typ} still hold "
                        f"it as {before}, which Iceberg readers do not read as {typ}")
        return None

    def _conflicting(self, schema_id: int) -> set[int]:
        """File schema ids (of any file the table records) unreadable as ``schema_id``."""
        found = self._conflicts.get(schema_id)
        if found is None:
            if self._all_file_schemas is None:
                self._all_file_schemas = self._file_schema_ids(None)
            found = {s for s in self._all_file_schemas if self._unreadable(s, schema_id)}
            self._conflicts[schema_id] = found
        return found

    def problem(self, snapshot: dict[str, Any]) -> str | None:
        """Why a snapshot (a row of ``iceberg_snapshot_rows``) has no Iceberg view."""
        sid, schema_id = int(snapshot["snapshot_id"]), int(snapshot["schema_id"])
        rec = self.rec
        if rec.primary_key and not rec.as_of(sid).deletion_vectors:
            return (f"snapshot {sid} of {rec.full_name} was written before the table was "
                    "switched to deletion vectors (in merge-on-read mode)")
        converted = self.schema_json(schema_id)
        if isinstance(converted, Unsupported):
            return type_problem(rec, converted, f" at snapshot {sid}")
        if self._conflicting(schema_id):
            for file_schema in sorted(self._file_schema_ids(sid)):
                why = self._unreadable(file_schema, schema_id)
                if why:
                    return (f"Snapshot {sid} of {rec.full_name} has no Iceberg view: {why}. "
                            "Rewrite those files (compact(full=True) on a primary-key table, "
                            "an overwrite on others) to give it one")
        return None

