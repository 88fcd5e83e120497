"""Primary-key tables: options, bucketing and the write path of upserts, deletes and changes.

Rows hash to buckets by key (:mod:`arrowlake.table.bucketing`). Each commit writes, per touched
partition and bucket, one run: a Parquet file sorted by key with unique keys and an int8 row-kind
column. Versions of a key inside one write are resolved by the table's merge engine in input
order; versions across runs are merged when read (:mod:`arrowlake.table.merge_read`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import CommitConflict, SchemaMismatch, ValidationError
from arrowlake.io.stats import encode_partition_value, encode_scalar
from arrowlake.io.writer import DataFileWriter, FileTarget, close_all, split_by_columns
from arrowlake.metastore.store import NewFile
from arrowlake.schema import FIELD_ID_KEY, find_field
from arrowlake.table import changelog
from arrowlake.table.bucketing import bucket_of
from arrowlake.table.merging import (
    ENGINES,
    ROW_KIND,
    SEQUENCE,
    MergeEngine,
    RowKind,
    dedupe_within_write,
    engine_from_options,
)

if TYPE_CHECKING:
    from arrowlake.table.table import Table
    from arrowlake.table.writes import WriteResult

#: The row-kind column as stored in data files of primary-key tables.
KIND_COLUMN = "_al_row_kind"
#: Its field id: far above any id a user schema reaches, and never assigned to user columns.
KIND_FIELD_ID = 2_000_000_000
KIND_FIELD = pa.field(KIND_COLUMN, pa.int8(), nullable=False,
                      metadata={FIELD_ID_KEY: str(KIND_FIELD_ID).encode()})

ROW_KIND_NAMES = ("+I", "-U", "+U", "-D")
DEFAULT_BUCKETS = 4

_KEY_TYPES = "integers, strings, binaries, dates, times, timestamps, booleans and decimals"


def _key_type_ok(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_string_view(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t)
            or pa.types.is_boolean(t) or pa.types.is_decimal(t))


_OPTION_NAMES = ("merge_engine", "sequence_field", "aggregations", "ignore_delete",
                 "partial_update_ignore_delete", "default_aggregation", "changelog_producer")


def validate_pk_options(schema: pa.Schema, primary_key: Sequence[str],
                        partition_by: Sequence[str], buckets: int | None,
                        props: dict[str, str], options: Mapping[str, Any]
                        ) -> tuple[pa.Schema, int | None, dict[str, str]]:
    """Check a primary-key table's definition; return its schema (keys non-null), buckets and
    properties. Every problem is a clear error before anything is created."""
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise ValidationError(
            f"Unknown table options: {', '.join(unknown)}; valid ones are "
            f"{', '.join(_OPTION_NAMES)}")
    if not primary_key:
        if options or buckets is not None:
            raise ValidationError(
                "merge_engine, sequence_field, aggregations and buckets need a primary_key")
        return schema, None, props
    if len(set(primary_key)) != len(primary_key):
        raise ValidationError(f"primary_key repeats columns: {list(primary_key)}")
    for name in primary_key:
        field = find_field(schema, name)
        if not _key_type_ok(field.type):
            raise SchemaMismatch(
                f"Column '{name}' of type {field.type} cannot be part of a primary key: key "
                f"columns may be {_KEY_TYPES}")
    for name in (ROW_KIND, SEQUENCE):
        if name in schema.names:
            raise SchemaMismatch(
                f"Column name '{name}' is reserved in primary-key tables; rename the column")
    missing = [p for p in partition_by if p not in primary_key]
    if missing:
        raise ValidationError(
            f"Partition columns must be part of the primary key; not in it: {missing}. Add them "
            "to primary_key (a key must map to one partition)")
    if buckets is None:
        buckets = DEFAULT_BUCKETS
    if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1:
        raise ValidationError(f"buckets must be a positive integer, got {buckets!r}")
    engine_name = str(options.get("merge_engine", "deduplicate"))
    if engine_name not in ENGINES:
        raise ValidationError(
            f"Unknown merge_engine '{engine_name}'; valid engines are {', '.join(ENGINES)}")
    seq = options.get("sequence_field")
    if seq is not None:
        field = find_field(schema, seq)
        if seq in primary_key:
            raise ValidationError(f"sequence_field '{seq}' may not be part of the primary key")
        if not (pa.types.is_integer(field.type) or pa.types.is_timestamp(field.type)
                or pa.types.is_date(field.type) or pa.types.is_floating(field.type)
                or pa.types.is_decimal(field.type)):
            raise SchemaMismatch(
                f"sequence_field '{seq}' has type {field.type}; it must be a number, date or "
                "timestamp")
    aggregations = options.get("aggregations")
    if aggregations is not None and engine_name != "aggregation":
        raise ValidationError("aggregations= needs merge_engine='aggregation'")
    # Key columns never hold nulls: make that part of the schema, so writes check it.
    fields = [f.with_nullable(False) if f.name in primary_key else f for f in schema]
    schema = pa.schema(fields, metadata=schema.metadata)
    props = dict(props)
    props["merge-engine"] = engine_name
    if seq is not None:
        props["sequence-field"] = str(seq)
    for flag in ("ignore_delete", "partial_update_ignore_delete"):
        if options.get(flag):
            props[flag.replace("_", "-").replace("partial-update-", "partial-update.")] = "true"
    if aggregations:
        if not isinstance(aggregations, Mapping):
            raise ValidationError("aggregations must be a dict of column name to function")
        for column, function in aggregations.items():
            props[f"fields.{column}.aggregate-function"] = str(function)
    if options.get("default_aggregation"):
        props["fields.default-aggregate-function"] = str(options["default_aggregation"])
    props.setdefault("compaction.max-runs", "5")
    if "changelog_producer" in options:
        props["changelog-producer"] = changelog.check_producer(options["changelog_producer"],
                                                               primary_key)
    # Builds the engine once so bad aggregation functions fail now.
    engine_from_options(engine_name, schema, list(primary_key), _engine_options(props))
    return schema, buckets, props


def _engine_options(props: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items()
            if k.startswith("fields.") or k in ("ignore-delete", "partial-update.ignore-delete",
                                                "aggregation.remove-record-on-delete")}


def merge_engine(table: Table) -> MergeEngine:
    props = table._record.properties
    return engine_from_options(props.get("merge-engine", "deduplicate"), table.schema,
                               list(table._record.primary_key), _engine_options(props))


def sequence_field(table: Table) -> str | None:
    return table._record.properties.get("sequence-field")


def require_primary_key(table: Table, what: str) -> None:
    if not table._record.primary_key:
        raise ValidationError(
            f"{what} needs a table with a primary key; '{table.name}' has none. Use append(), "
            "overwrite() or delete(), or create the table with primary_key=[...]")


# -- row kinds ----------------------------------------------------------------------------------


def row_kinds_from(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Row kinds given as strings (``+I -U +U -D``) or integers (0..3) as int8 codes."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.null_count:
        raise ValidationError(f"The row-kind column has {column.null_count} null values")
    if pa.types.is_integer(column.type):
        codes = column.cast(pa.int8(), safe=False)
        bad = pc.sum(pc.or_(pc.less(column, 0), pc.greater(column, 3))).as_py() or 0
    elif (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
          or pa.types.is_string_view(column.type)):
        idx = pc.index_in(column.cast(pa.string()), value_set=pa.array(ROW_KIND_NAMES))
        bad = idx.null_count
        codes = pc.fill_null(idx, 0).cast(pa.int8())
    else:
        raise ValidationError(
            f"The row-kind column must hold strings (+I, -U, +U, -D) or int8 codes 0-3, not "
            f"{column.type}")
    if bad:
        raise ValidationError(
            f"{bad} rows have an unknown row kind; allowed are +I, -U, +U, -D (or 0-3)")
    return codes


# -- writing runs -------------------------------------------------------------------------------


def _run_schema(table: Table) -> pa.Schema:
    return table.schema.append(KIND_FIELD)


def _key_json(row: pa.Table, key: Sequence[str]) -> str:
    return json.dumps([encode_scalar(row.column(k)[0]) for k in key], separators=(",", ":"))


def write_runs(table: Table, rows: pa.Table) -> list[NewFile]:
    """Write ``rows`` (table schema + ``_row_kind``) as one sorted run per partition and bucket."""
    from arrowlake.table.writes import WriteOptions, _discard

    rec = table._record
    key = list(rec.primary_key)
    buckets = int(rec.buckets or DEFAULT_BUCKETS)
    engine = merge_engine(table)
    seq_field = sequence_field(table)
    schema = _run_schema(table)
    target = FileTarget(storage=table._storage, location=rec.location, schema=schema,
                        schema_id=rec.current_schema_id,
                        options=WriteOptions.from_properties(rec.properties, sorted_runs=True))
    with_bucket = rows.append_column("_al_bucket", bucket_of(rows, key, buckets))
    files: list[NewFile] = []
    writers: list[DataFileWriter] = []
    try:
        as_batch = pa.RecordBatch.from_arrays(
            [c.combine_chunks() for c in with_bucket.columns], schema=with_bucket.schema)
        groups = split_by_columns(as_batch, [*rec.partition_by, "_al_bucket"])
        for values, part in groups:
            part = pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) else part
            bucket = int(values[-1].as_py())
            # Partition columns are constant here: sorting by the rest is the same order.
            run = dedupe_within_write(part.drop_columns(["_al_bucket"]), key, engine, seq_field,
                                      constant=rec.partition_by)
            run = run.rename_columns([KIND_COLUMN if c == ROW_KIND else c
                                      for c in run.column_names]).select(schema.names)
            run = pa.Table.from_arrays(run.columns, schema=schema)
            shown = [v.as_py() if v.is_valid else None for v in values[:-1]]
            from arrowlake.io.stats import partition_path

            ppath = partition_path(rec.partition_by, shown) if rec.partition_by else None
            directory = "/".join(p for p in ("data", ppath, f"bucket-{bucket}") if p)
            writer = DataFileWriter(
                target, directory, partition_path=ppath,
                partition_values=json.dumps([encode_partition_value(v) for v in values[:-1]])
                if rec.partition_by else None,
                bucket=bucket,
                file_hook=lambda t: {"key_min": _key_json(t.slice(0, 1), key),
                                     "key_max": _key_json(t.slice(t.num_rows - 1, 1), key)})
            writers.append(writer)
            for batch in run.to_batches():
                writer.write(batch)
            writer.flush()
        files = close_all(writers)
    except BaseException:
        for writer in writers:
            writer.abort()
        _discard(table, files)
        raise
    return files


def collect(table: Table, data: Any, *, where: str = "input") -> pa.Table:
    """The whole input conformed to the table schema (a run must be sorted, so it is held)."""
    from arrowlake.table.writes import conformed

    batches = list(conformed(table, data, table.schema, where=where))
    if not batches:
        return table.schema.empty_table()
    return pa.Table.from_batches(batches, schema=table.schema)


def with_kinds(rows: pa.Table, kinds: pa.Array | RowKind) -> pa.Table:
    if isinstance(kinds, RowKind):
        kinds = pa.array(np.full(rows.num_rows, int(kinds), dtype=np.int8))
    return rows.append_column(ROW_KIND, kinds)


def commit_rows(table: Table, rows: pa.Table, kind: str, *, commit_id: str | None = None,
                summary: dict[str, Any] | None = None) -> WriteResult:
    """Write ``rows`` (with ``_row_kind``) as runs and commit them; then compact if needed."""
    from arrowlake.table.writes import WriteResult

    table.refresh()
    base = table.current_snapshot_id
    if rows.num_rows == 0:
        return WriteResult(None, kind)
    files = write_runs(table, rows)
    result = changelog.commit_runs(table, kind, base, files, rows, commit_id=commit_id,
                                   summary=summary)
    if result.snapshot_id is not None and not result.duplicate:
        from arrowlake.table.compaction import compact_if_needed

        compact_if_needed(table, {(f.partition_path, f.bucket) for f in files})
    return result


def upsert(table: Table, data: Any, *, commit_id: str | None = None) -> WriteResult:
    require_primary_key(table, "upsert()")
    table.refresh()
    rows = collect(table, data)
    return commit_rows(table, with_kinds(rows, RowKind.INSERT), "upsert", commit_id=commit_id)


def write_changes(table: Table, data: Any, row_kind: str = "op", *,
                  commit_id: str | None = None) -> WriteResult:
    """Write CDC rows: ``row_kind`` names the column holding ``+I -U +U -D`` (or 0-3)."""
    require_primary_key(table, "write_changes()")
    table.refresh()
    from arrowlake.table.inputs import batch_stream

    schema, batches = batch_stream(data)
    if row_kind not in schema.names:
        raise ValidationError(
            f"The change data has no row-kind column '{row_kind}'; columns are "
            f"{', '.join(schema.names)}")
    kinds: list[pa.Array] = []

    def data_batches() -> Iterable[pa.RecordBatch]:
        for batch in batches:
            kinds.append(row_kinds_from(batch.column(row_kind)))
            yield batch.drop_columns([row_kind])

    # A reader (not a bare generator) keeps the schema known when the input has no rows.
    stripped = schema.remove(schema.get_field_index(row_kind))
    reader = pa.RecordBatchReader.from_batches(stripped, data_batches())
    rows = collect(table, reader, where="change data")
    codes = pa.concat_arrays(kinds) if kinds else pa.array([], pa.int8())
    return commit_rows(table, with_kinds(rows, codes), "changes", commit_id=commit_id)


def delete_keys(table: Table, expr: Any, *, commit_id: str | None = None) -> WriteResult:
    """Write tombstones for every key whose current row matches ``expr`` (no rewrite)."""
    from arrowlake.table.writes import WriteResult

    table.refresh()
    matched = table.scan(filter=expr).to_arrow()
    if matched.num_rows == 0:
        return WriteResult(None, "delete")
    tombstones = with_kinds(matched, RowKind.DELETE)
    result = commit_rows(table, tombstones, "delete", commit_id=commit_id,
                         summary={"deleted_rows": matched.num_rows})
    from dataclasses import replace

    return replace(result, removed_rows=matched.num_rows, added_rows=0)


def overwrite(table: Table, data: Any, expr: Any, *, commit_id: str | None = None
              ) -> WriteResult:
    """Replace the rows of whole partitions (or the whole table) of a primary-key table."""
    from arrowlake.expressions import AlwaysTrue, referenced_columns
    from arrowlake.scan.planning import fully_matching, plan_files
    from arrowlake.table.writes import _conflict_on_new_matches, _discard, conformed

    table.refresh()
    rec = table._record
    outside = referenced_columns(expr) - set(rec.partition_by)
    if outside:
        raise ValidationError(
            f"An overwrite of a primary-key table may only filter on partition columns "
            f"({', '.join(rec.partition_by) or 'none'}); the filter uses {sorted(outside)}. "
            "Use delete() and upsert() to replace individual keys.")
    check = None if isinstance(expr, AlwaysTrue) else expr
    batches = list(conformed(table, data, table.schema, check=check))
    rows = pa.Table.from_batches(batches, schema=table.schema) if batches else \
        table.schema.empty_table()
    from arrowlake.table.writes import WriteResult

    files = write_runs(table, with_kinds(rows, RowKind.INSERT)) if rows.num_rows else []
    try:
        for attempt in range(5):
            table.refresh()
            base = table.current_snapshot_id
            view = table._view(base, current_schema=True)
            old = plan_files(view, expr)
            if old.num_rows and not isinstance(expr, AlwaysTrue):
                old = old.filter(fully_matching(view, old, expr))
            remove = old.column("file_id").to_pylist()
            if not files and not remove:
                return WriteResult(None, "overwrite")
            from arrowlake.metastore.store import SnapshotChange

            change = SnapshotChange(
                kind="overwrite", schema_id=rec.current_schema_id, add=files, remove=remove,
                removed_rows=int(pa.compute.sum(old.column("row_count")).as_py() or 0),
                commit_id=commit_id, on_rebase=_conflict_on_new_matches(table, expr))
            try:
                result = table._metastore.commit(rec.table_id, base, change)
            except CommitConflict:
                if attempt == 4:
                    raise
                continue
            return WriteResult(result.snapshot_id, "overwrite", len(files), len(remove),
                               rows.num_rows, change.removed_rows, result.attempts,
                               result.duplicate)
    except BaseException:
        _discard(table, files)
        raise
    raise AssertionError("unreachable")
