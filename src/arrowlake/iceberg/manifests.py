"""Iceberg v3 manifests and manifest lists: their Avro schemas, and their records made from the
metastore's rows.

A data manifest lists data files: path, partition tuple, row count, size, the column
statistics of the metastore (value, null and NaN counts; lower and upper bounds in Iceberg's
single-value serialization, for the types whose stored bounds convert) and the file's first
row id. Bounds are those of every row the file holds: a file with a deletion vector is
described by bounds that are valid, not tight. A delete manifest lists deletion vectors: the
Puffin file and the blob's range, the data file it belongs to, and its cardinality.

Data and file sequence numbers are written on every entry (never inherited): a data file's is
the snapshot that added it, a vector's the snapshot that recorded it, which is never lower
than its data file's, as Iceberg requires for a delete to apply.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from arrowlake.iceberg import avro
from arrowlake.iceberg.types import (
    IcebergType,
    avro_type,
    avro_value,
    bound_bytes,
    has_values,
    iceberg_type,
    iceberg_value,
)
from arrowlake.io.stats import STATS_VERSION, STATS_VERSION_KEY, parse_stats
from arrowlake.metastore.iceberg import ManifestRecord
from arrowlake.schema import field_id

STATUS_EXISTING, STATUS_ADDED, STATUS_DELETED = 0, 1, 2
CONTENT_DATA, CONTENT_DELETES = 0, 1


@dataclass(frozen=True)
class PartitionField:
    """An identity partition field of the published spec."""

    field_id: int  # 1000, 1001, ...
    name: str
    source_id: int
    index: int  # the column's position in the table's partition_by (its partition values)
    arrow_type: pa.DataType
    iceberg_type: str


@dataclass(frozen=True)
class PartitionSpec:
    fields: tuple[PartitionField, ...]

    def json_fields(self) -> list[dict[str, Any]]:
        return [{"name": f.name, "transform": "identity", "source-id": f.source_id,
                 "field-id": f.field_id} for f in self.fields]

    @property
    def key(self) -> str:
        """What identifies the spec a manifest was written with (its partition tuple's
        layout): a manifest of another spec is rewritten, never reused."""
        return json.dumps([[f.field_id, f.name, f.source_id, f.iceberg_type]
                           for f in self.fields])

    def values(self, stored: Sequence[Any] | None) -> list[Any]:
        """The partition tuple (Iceberg values) of a partition's stored values."""
        out = []
        for f in self.fields:
            value = None if stored is None else stored[f.index]
            out.append(None if value is None else iceberg_value(f.arrow_type, value))
        return out


def partition_spec(schema: pa.Schema, partition_by: Sequence[str]) -> PartitionSpec:
    """The identity partitions of a table. Only columns whose partition values convert
    exactly are declared (not floating point, whose NaN is recorded as null; not binary),
    and never a bucket: arrowlake's buckets use its own hash, not Iceberg's, so declaring one
    would make readers prune the wrong files. Leaving a column out only costs pruning."""
    fields: list[PartitionField] = []
    for index, name in enumerate(partition_by):
        if name not in schema.names:
            continue
        field = schema.field(name)
        if not has_values(field.type) or pa.types.is_floating(field.type):
            continue
        typ = iceberg_type(field.type, name)
        assert isinstance(typ, str)
        fields.append(PartitionField(1000 + len(fields), name, field_id(field), index,
                                     field.type, typ))
    return PartitionSpec(tuple(fields))


# -- Avro schemas -------------------------------------------------------------------------------


def _optional(name: str, typ: Any, fid: int) -> dict[str, Any]:
    return {"name": name, "type": ["null", typ], "default": None, "field-id": fid}


def _required(name: str, typ: Any, fid: int) -> dict[str, Any]:
    return {"name": name, "type": typ, "field-id": fid}


def _int_map(key_id: int, value_id: int, value: str) -> dict[str, Any]:
    return {"type": "array", "logicalType": "map", "items": {
        "type": "record", "name": f"k{key_id}_v{value_id}",
        "fields": [_required("key", "int", key_id), _required("value", value, value_id)]}}


def _avro_name(name: str) -> str:
    """A valid Avro name for a partition field (Iceberg's sanitizing)."""
    out = []
    for i, ch in enumerate(name):
        if ch == "_" or (ch.isascii() and (ch.isalpha() or (ch.isdigit() and i > 0))):
            out.append(ch)
        elif ch.isascii() and ch.isdigit():
            out.append("_" + ch)
        else:
            out.append("_x" + format(ord(ch), "X"))
    return "".join(out) or "_"


def manifest_schema(spec: PartitionSpec) -> dict[str, Any]:
    """The Avro schema of a v3 manifest (``manifest_entry``) for ``spec``'s partition tuple."""
    defined: set[str] = set()
    partition_fields = []
    for f in spec.fields:
        out = _optional(_avro_name(f.name), avro_type(f.iceberg_type, defined), f.field_id)
        if out["name"] != f.name:
            out["iceberg-field-name"] = f.name
        partition_fields.append(out)
    data_file = {"type": "record", "name": "r2", "fields": [
        _required("content", "int", 134),
        _required("file_path", "string", 100),
        _required("file_format", "string", 101),
        _required("partition", {"type": "record", "name": "r102",
                                "fields": partition_fields}, 102),
        _required("record_count", "long", 103),
        _required("file_size_in_bytes", "long", 104),
        _optional("column_sizes", _int_map(117, 118, "long"), 108),
        _optional("value_counts", _int_map(119, 120, "long"), 109),
        _optional("null_value_counts", _int_map(121, 122, "long"), 110),
        _optional("nan_value_counts", _int_map(138, 139, "long"), 137),
        _optional("lower_bounds", _int_map(126, 127, "bytes"), 125),
        _optional("upper_bounds", _int_map(129, 130, "bytes"), 128),
        _optional("key_metadata", "bytes", 131),
        _optional("split_offsets", {"type": "array", "items": "long", "element-id": 133}, 132),
        _optional("equality_ids", {"type": "array", "items": "int", "element-id": 136}, 135),
        _optional("sort_order_id", "int", 140),
        _optional("first_row_id", "long", 142),
        _optional("referenced_data_file", "string", 143),
        _optional("content_offset", "long", 144),
        _optional("content_size_in_bytes", "long", 145),
    ]}
    return {"type": "record", "name": "manifest_entry", "fields": [
        _required("status", "int", 0),
        _optional("snapshot_id", "long", 1),
        _optional("sequence_number", "long", 3),
        _optional("file_sequence_number", "long", 4),
        _required("data_file", data_file, 2),
    ]}


MANIFEST_LIST_SCHEMA: dict[str, Any] = {"type": "record", "name": "manifest_file", "fields": [
    _required("manifest_path", "string", 500),
    _required("manifest_length", "long", 501),
    _required("partition_spec_id", "int", 502),
    _required("content", "int", 517),
    _required("sequence_number", "long", 515),
    _required("min_sequence_number", "long", 516),
    _required("added_snapshot_id", "long", 503),
    _required("added_files_count", "int", 504),
    _required("existing_files_count", "int", 505),
    _required("deleted_files_count", "int", 506),
    _required("added_rows_count", "long", 512),
    _required("existing_rows_count", "long", 513),
    _required("deleted_rows_count", "long", 514),
    _optional("partitions", {"type": "array", "element-id": 508, "items": {
        "type": "record", "name": "r508", "fields": [
            _required("contains_null", "boolean", 509),
            _optional("contains_nan", "boolean", 518),
            _optional("lower_bound", "bytes", 510),
            _optional("upper_bound", "bytes", 511)]}}, 507),
    _optional("key_metadata", "bytes", 519),
    _optional("first_row_id", "long", 520),
]}


# -- entries ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Column:
    fid: int
    key: str  # the field id as the statistics JSON keys it
    arrow_type: pa.DataType
    iceberg_type: str
    bounds: bool
    floating: bool
    decimal: bool


@functools.lru_cache(maxsize=256)
def _stat_columns(schema: pa.Schema) -> tuple[_Column, ...]:
    """The top-level primitive columns of a file schema whose statistics an entry carries."""
    out = []
    for field in schema:
        try:
            typ: IcebergType = iceberg_type(field.type, field.name)
        except Exception:
            continue  # a column Iceberg lacks, since dropped: readers never ask for it
        if not isinstance(typ, str):
            continue
        fid = field_id(field)
        out.append(_Column(fid, str(fid), field.type, typ, has_values(field.type),
                           pa.types.is_floating(field.type), pa.types.is_decimal(field.type)))
    return tuple(out)


def _bound(column: _Column, stored: Any, lower: bool) -> bytes:
    value = iceberg_value(column.arrow_type, stored)
    if column.floating and value == 0.0:
        # -0.0 sorts before +0.0 for Iceberg; stored bounds do not tell the zeros apart.
        value = -0.0 if lower else 0.0
    return bound_bytes(column.iceberg_type, value)


def data_file_record(row: Mapping[str, Any], path: str, schema: pa.Schema,
                     partition: Mapping[str, Any]) -> dict[str, Any]:
    """The ``data_file`` struct of a data file row (:data:`ENTRY_FILE_SCHEMA`), written in
    ``schema``, at absolute ``path``."""
    stats = parse_stats(row["stats"]) if row["stats"] else {}
    trusted = stats.get(STATS_VERSION_KEY, 1) >= STATS_VERSION
    rows = int(row["row_count"])
    values, nulls, nans, lows, highs = [], [], [], [], []
    for column in _stat_columns(schema):
        entry = stats.get(column.key)
        if entry is None:
            continue
        values.append({"key": column.fid, "value": rows})
        if entry[2] is not None:
            nulls.append({"key": column.fid, "value": int(entry[2])})
        if column.floating and len(entry) > 3 and entry[3] is not None:
            nans.append({"key": column.fid, "value": int(entry[3])})
        if column.bounds and entry[0] is not None and entry[1] is not None and (
                trusted or not column.decimal):
            lows.append({"key": column.fid, "value": _bound(column, entry[0], True)})
            highs.append({"key": column.fid, "value": _bound(column, entry[1], False)})
    return {
        "content": CONTENT_DATA, "file_path": path, "file_format": "PARQUET",
        "partition": partition, "record_count": rows,
        "file_size_in_bytes": int(row["file_size"]),
        "value_counts": values or None, "null_value_counts": nulls or None,
        "nan_value_counts": nans or None, "lower_bounds": lows or None,
        "upper_bounds": highs or None, "first_row_id": row["first_row_id"],
    }


def vector_record(path: str, file_size: int, offset: int, length: int, cardinality: int,
                  data_path: str, partition: Mapping[str, Any]) -> dict[str, Any]:
    """The ``data_file`` struct of a deletion vector: the blob at ``offset`` in the Puffin
    file at ``path``, for the data file at ``data_path``."""
    return {
        "content": CONTENT_DELETES, "file_path": path, "file_format": "PUFFIN",
        "partition": partition, "record_count": cardinality, "file_size_in_bytes": file_size,
        "referenced_data_file": data_path, "content_offset": offset,
        "content_size_in_bytes": length,
    }


def entry(status: int, snapshot_id: int, sequence: int, data_file: dict[str, Any]
          ) -> dict[str, Any]:
    return {"status": status, "snapshot_id": snapshot_id, "sequence_number": sequence,
            "file_sequence_number": sequence, "data_file": data_file}


# -- files --------------------------------------------------------------------------------------


@dataclass
class ManifestDraft:
    """A manifest to write: its entries, and what its manifest-list row says of them."""

    content: int
    entries: list[dict[str, Any]]
    file_ids: list[int]  # the data files of its live entries
    partition_tuples: list[list[Any]]  # of every entry, for the partition summaries


def write_manifest(draft: ManifestDraft, spec: PartitionSpec, schema_json: Mapping[str, Any],
                   schema_id: int, snapshot_id: int, first_row_id: int | None,
                   path: str) -> tuple[bytes, ManifestRecord]:
    """The bytes of a manifest and the record of it (``path`` relative to the table)."""
    metadata = {
        "schema": json.dumps(schema_json, separators=(",", ":")),
        "schema-id": str(schema_id),
        "partition-spec": json.dumps(spec.json_fields(), separators=(",", ":")),
        "partition-spec-id": "0",
        "format-version": "3",
        "content": "data" if draft.content == CONTENT_DATA else "deletes",
    }
    data = avro.container(manifest_schema(spec), draft.entries, metadata=metadata)
    counts = {STATUS_ADDED: [0, 0], STATUS_EXISTING: [0, 0], STATUS_DELETED: [0, 0]}
    live_sequences = []
    for e in draft.entries:
        count = counts[e["status"]]
        count[0] += 1
        count[1] += e["data_file"]["record_count"]
        if e["status"] != STATUS_DELETED:
            live_sequences.append(e["sequence_number"])
    ids = np.array(sorted(draft.file_ids), dtype="<i8")
    record = ManifestRecord(
        path=path, content=draft.content, added_snapshot=snapshot_id, length=len(data),
        spec_key=_hash(spec.key), min_sequence=min(live_sequences, default=snapshot_id),
        added_files=counts[STATUS_ADDED][0], existing_files=counts[STATUS_EXISTING][0],
        deleted_files=counts[STATUS_DELETED][0], added_rows=counts[STATUS_ADDED][1],
        existing_rows=counts[STATUS_EXISTING][1], deleted_rows=counts[STATUS_DELETED][1],
        first_row_id=first_row_id if draft.content == CONTENT_DATA else None,
        partitions=json.dumps(_summaries(spec, draft.partition_tuples)),
        min_file_id=int(ids[0]) if len(ids) else None,
        max_file_id=int(ids[-1]) if len(ids) else None, file_ids=ids.tobytes())
    return data, record


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def spec_hash(spec: PartitionSpec) -> str:
    return _hash(spec.key)


def _summaries(spec: PartitionSpec, tuples: list[list[Any]]) -> list[list[Any]]:
    """Per partition field: contains null, lower and upper bound (hex of their bytes)."""
    out = []
    for i, f in enumerate(spec.fields):
        values = [t[i] for t in tuples]
        present = [v for v in values if v is not None]
        low = bound_bytes(f.iceberg_type, min(present)).hex() if present else None
        high = bound_bytes(f.iceberg_type, max(present)).hex() if present else None
        out.append([len(present) < len(values), low, high])
    return out


def partition_record(spec: PartitionSpec, values: list[Any]) -> dict[str, Any]:
    """The ``partition`` struct of an entry."""
    return {_avro_name(f.name): avro_value(f.iceberg_type, v)
            for f, v in zip(spec.fields, values, strict=True)}


def manifest_list_record(m: ManifestRecord, absolute_path: str) -> dict[str, Any]:
    partitions = [{"contains_null": bool(s[0]), "contains_nan": False,
                   "lower_bound": None if s[1] is None else bytes.fromhex(s[1]),
                   "upper_bound": None if s[2] is None else bytes.fromhex(s[2])}
                  for s in json.loads(m.partitions)]
    return {
        "manifest_path": absolute_path, "manifest_length": m.length, "partition_spec_id": 0,
        "content": m.content, "sequence_number": m.added_snapshot,
        "min_sequence_number": m.min_sequence, "added_snapshot_id": m.added_snapshot,
        "added_files_count": m.added_files, "existing_files_count": m.existing_files,
        "deleted_files_count": m.deleted_files, "added_rows_count": m.added_rows,
        "existing_rows_count": m.existing_rows, "deleted_rows_count": m.deleted_rows,
        "partitions": partitions, "first_row_id": m.first_row_id,
    }


def write_manifest_list(manifests: Sequence[tuple[ManifestRecord, str]], snapshot: int,
                        parent: int | None, first_row_id: int | None) -> bytes:
    """A manifest list of ``(manifest, its absolute path)``."""
    metadata = {"snapshot-id": str(snapshot), "sequence-number": str(snapshot),
                "format-version": "3"}
    if parent is not None:
        metadata["parent-snapshot-id"] = str(parent)
    if first_row_id is not None:
        metadata["first-row-id"] = str(first_row_id)
    return avro.container(MANIFEST_LIST_SCHEMA, [manifest_list_record(m, p)
                                                  for m, p in manifests], metadata=metadata)
