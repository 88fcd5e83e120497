"""Primary-key tables: options, bucketing and the write path of upserts, deletes and changes.

Rows hash to buckets by key (:mod:`arrowlake.merge.bucketing`). Each commit writes, per touched
partition and bucket, one run: a Parquet file sorted by key with unique keys and an int8 row-kind
column. Versions of a key inside one write are resolved by the table's merge engine in input
order; versions across runs are merged when read (:mod:`arrowlake.merge.read`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import CommitConflict, SchemaMismatch, ValidationError
from arrowlake.expressions import AlwaysTrue, Expr, referenced_columns
from arrowlake.io.stats import decode_values, encode_partition_value, partition_path
from arrowlake.io.writer import (
    DataFileWriter,
    FileTarget,
    WriteOptions,
    close_all,
    dictionary_columns,
    split_by_columns,
)
from arrowlake.merge import (
    ENGINES,
    ROW_KIND,
    SEQUENCE,
    Aggregation,
    Deduplicate,
    FirstRow,
    MergeEngine,
    PartialUpdate,
    RowKind,
    dedupe_within_write,
    engine_from_options,
)
from arrowlake.merge.bucketing import bucket_of
from arrowlake.merge.engines import unique_run_order
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD, key_json, row_kinds_from
from arrowlake.metastore.store import NewFile, SnapshotChange
from arrowlake.scan.planning import fully_matching, plan_files
from arrowlake.scan.read import constant_column
from arrowlake.scan.scan import Scan
from arrowlake.schema import field_id, find_field
from arrowlake.table import changelog
from arrowlake.table.compaction import (
    CompactionOptions,
    compact_if_needed,
    compaction_options,
)
from arrowlake.table.inputs import batch_stream
from arrowlake.table.run_cache import remember_runs, run_cache_bytes
from arrowlake.table.writes import (
    WriteResult,
    _conflict_on_new_matches,
    _discard,
    conformed,
)

if TYPE_CHECKING:
    from arrowlake.table.table import Table

_log = logging.getLogger(__name__)

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
    for name in (ROW_KIND, SEQUENCE, KIND_COLUMN):
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
    given = props.get("merge-engine")
    engine_name = str(options.get("merge_engine", given or "deduplicate"))
    if given is not None and given != engine_name:
        raise ValidationError(
            f"merge_engine='{engine_name}' and property 'merge-engine'='{given}' disagree; "
            "give one of them")
    if engine_name not in ENGINES:
        raise ValidationError(
            f"Unknown merge_engine '{engine_name}' (property 'merge-engine'); valid engines "
            f"are {', '.join(ENGINES)}")
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
    props.setdefault("compaction.max-runs", str(CompactionOptions().max_runs))
    if "changelog_producer" in options:
        props["changelog-producer"] = changelog.check_producer(options["changelog_producer"],
                                                               primary_key)
    # Builds the engine once so bad aggregation functions fail now.
    engine_from_options(engine_name, schema, list(primary_key), _engine_options(props))
    return schema, buckets, props


#: Properties that say how the runs already written merge: fixed once the table exists.
FIXED_PROPERTIES = ("merge-engine", "sequence-field", "ignore-delete",
                    "partial-update.ignore-delete", "aggregation.remove-record-on-delete",
                    "fields.default-aggregate-function")
_FLAG_PROPERTIES = ("ignore-delete", "partial-update.ignore-delete",
                    "aggregation.remove-record-on-delete")


def is_engine_property(name: str) -> bool:
    return name in FIXED_PROPERTIES or name.startswith("fields.")


def validate_properties(props: Mapping[str, str], primary_key: Sequence[str]) -> None:
    """Check every property arrowlake reads, so a malformed one fails when it is set, never
    in a later write. Unknown properties are kept as user metadata."""
    if "buckets" in props:
        raise ValidationError(
            "'buckets' is not a property: give buckets= to create_table(); a table's bucket "
            "count is fixed once rows are written")
    WriteOptions.from_properties(dict(props))
    compaction_options(props)
    run_cache_bytes(props)
    engine_props = sorted(k for k in props if is_engine_property(k))
    if engine_props and not primary_key:
        raise ValidationError(
            f"Properties {engine_props} configure merge engines and need a table with a "
            "primary key")
    engine = props.get("merge-engine", "deduplicate")
    if engine not in ENGINES:
        raise ValidationError(
            f"Property 'merge-engine' must be one of {', '.join(ENGINES)}, not {engine!r}")
    flags = [k for k in props if k in _FLAG_PROPERTIES or
             (k.startswith("fields.") and k.endswith(".ignore-retract"))]
    for name in flags:
        if str(props[name]).strip().lower() not in ("true", "false"):
            raise ValidationError(
                f"Property '{name}' must be 'true' or 'false', not {props[name]!r}")


def _engine_options(props: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items()
            if k.startswith("fields.") or k in ("ignore-delete", "partial-update.ignore-delete",
                                                "aggregation.remove-record-on-delete")}


def translate_properties(props: Mapping[str, str], old: pa.Schema, new: pa.Schema
                         ) -> dict[str, str]:
    """``props`` with the columns its merge options name (``sequence-field``,
    ``fields.<column>.*``) renamed from ``old`` to ``new`` by field id. Options of columns
    ``new`` lacks are left out (a column added after an old snapshot)."""
    ids = {f.name: field_id(f) for f in old}
    names = {field_id(f): f.name for f in new}

    def renamed(column: str) -> str | None:
        fid = ids.get(column)
        return column if fid is None else names.get(fid)

    out: dict[str, str] = {}
    for name, value in props.items():
        if name == "sequence-field":
            out[name] = renamed(value) or value
        elif name.startswith("fields.") and name != "fields.default-aggregate-function":
            parts = name.split(".")
            column = renamed(".".join(parts[1:-1]))
            if column is not None:
                out[f"fields.{column}.{parts[-1]}"] = value
        else:
            out[name] = value
    return out


def _properties_for(table: Table, schema: pa.Schema | None) -> dict[str, str]:
    props = table._record.properties
    if schema is None or schema.equals(table.schema, check_metadata=True):
        return dict(props)
    return translate_properties(props, table.schema, schema)


def merge_engine(table: Table, schema: pa.Schema | None = None) -> MergeEngine:
    """The table's merge engine for reading files in ``schema`` (the current one by default):
    options follow columns by field id, so renames and time travel keep them."""
    props = _properties_for(table, schema)
    return engine_from_options(props.get("merge-engine", "deduplicate"),
                               table.schema if schema is None else schema,
                               list(table._record.primary_key), _engine_options(props))


def sequence_field(table: Table, schema: pa.Schema | None = None) -> str | None:
    return _properties_for(table, schema).get("sequence-field")


#: Column names primary-key tables use internally.
RESERVED_NAMES = (ROW_KIND, SEQUENCE, KIND_COLUMN)


def engine_columns(table: Table) -> list[str]:
    """Columns the table's merge options name: they may be renamed, not dropped."""
    props = table._record.properties
    names = [props["sequence-field"]] if "sequence-field" in props else []
    names += [".".join(k.split(".")[1:-1]) for k in props
              if k.startswith("fields.") and k != "fields.default-aggregate-function"]
    return names


def check_pk_schema(table: Table, schema: pa.Schema) -> dict[str, str]:
    """The properties a primary-key table gets with its new ``schema``, after checking that its
    merge engine still works on it (a new column must suit the default aggregate function)."""
    props = translate_properties(table._record.properties, table.schema, schema)
    engine_from_options(props.get("merge-engine", "deduplicate"), schema,
                        list(table._record.primary_key), _engine_options(props))
    return props


def require_primary_key(table: Table, what: str) -> None:
    if not table._record.primary_key:
        raise ValidationError(
            f"{what} needs a table with a primary key; '{table.name}' has none. Use append(), "
            "overwrite() or delete(), or create the table with primary_key=[...]")


# -- writing runs -------------------------------------------------------------------------------


def _run_schema(table: Table) -> pa.Schema:
    return table.schema.append(KIND_FIELD)


def _run_groups(rows: pa.Table, key: list[str], partition_by: list[str], buckets: int,
                engine: MergeEngine, seq_field: str | None
                ) -> Iterable[tuple[tuple[pa.Scalar, ...], int, pa.Table]]:
    """``rows`` as one run per partition and bucket: ``(partition values, bucket, run)``, each
    run sorted by key with unique keys (:func:`dedupe_within_write`)."""
    bucket = bucket_of(rows, key, buckets)
    # The group of every row: its bucket, then its partition values' dictionary codes.
    codes = bucket.to_numpy().astype(np.int64)
    width = buckets
    for name in partition_by:
        encoded = pc.dictionary_encode(rows.column(name).combine_chunks(),
                                       null_encoding="encode")
        codes = codes + width * encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        width *= max(len(encoded.dictionary), 1)
    order = unique_run_order(rows, key, codes, engine, constant=partition_by)
    if order is not None:
        # No key repeats within a group, nothing to merge: one sort of the whole write, then
        # a take per group (what deduplicating each group would give), so that the write pool
        # encodes a group while the next one is taken.
        # Partition columns are constant in a group: built from its value, not taken.
        sorted_codes = codes[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_codes[1:] != sorted_codes[:-1])))
        ends = np.append(starts[1:], len(order))
        body = rows.drop_columns(partition_by)
        for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
            taken = body.take(pa.array(order[lo:hi]))
            values = tuple(rows.column(name)[int(order[lo])] for name in partition_by)
            constants = dict(zip(partition_by, values, strict=True))
            run = pa.Table.from_arrays(
                [constant_column(constants[f.name], hi - lo) if f.name in constants
                 else taken.column(f.name) for f in rows.schema], schema=rows.schema)
            yield values, int(sorted_codes[lo] % buckets), run
        return
    with_bucket = rows.append_column("_al_bucket", bucket)
    as_batch = pa.RecordBatch.from_arrays(
        [c.combine_chunks() for c in with_bucket.columns], schema=with_bucket.schema)
    for values, part in split_by_columns(as_batch, [*partition_by, "_al_bucket"]):
        table = pa.Table.from_batches([part]).drop_columns(["_al_bucket"])
        # Partition columns are constant here: sorting by the rest is the same order.
        yield values[:-1], int(values[-1].as_py()), dedupe_within_write(
            table, key, engine, seq_field, constant=partition_by)


def write_runs(table: Table, rows: pa.Table) -> list[NewFile]:
    """Write ``rows`` (table schema + ``_row_kind``) as one sorted run per partition and bucket."""
    files: list[NewFile] = []
    writers: list[DataFileWriter] = []
    try:
        written = _start_runs(table, rows, writers)
        files = close_all(writers)
    except BaseException:
        for writer in writers:
            writer.abort()
        _discard(table, files)
        raise
    remember_runs(table, written)
    return files


def _start_runs(table: Table, rows: pa.Table, writers: list[DataFileWriter]
                ) -> list[tuple[DataFileWriter, pa.Table]]:
    """Hand ``rows`` to the write pool as one sorted run per partition and bucket, each
    writer appended to ``writers`` (the caller closes them, or aborts them on an error);
    returns each writer with its run's rows."""
    rec = table._record
    key = list(rec.primary_key)
    buckets = int(rec.buckets or DEFAULT_BUCKETS)
    engine = merge_engine(table)
    seq_field = sequence_field(table)
    schema = _run_schema(table)
    target = FileTarget(storage=table._storage, location=rec.location, schema=schema,
                        schema_id=rec.current_schema_id,
                        options=WriteOptions.from_properties(rec.properties, sorted_runs=True))
    dictionary: list[str] | None = None
    written: list[tuple[DataFileWriter, pa.Table]] = []
    for values, bucket, run in _run_groups(rows, key, list(rec.partition_by), buckets,
                                           engine, seq_field):
        run = run.rename_columns([KIND_COLUMN if c == ROW_KIND else c
                                  for c in run.column_names]).select(schema.names)
        run = pa.Table.from_arrays(run.columns, schema=schema)
        if dictionary is None:
            # One choice of encodings for all the write's runs, not a sample per file.
            dictionary = dictionary_columns(run)
        shown = [v.as_py() if v.is_valid else None for v in values]
        ppath = partition_path(rec.partition_by, shown) if rec.partition_by else None
        directory = "/".join(p for p in ("data", ppath, f"bucket-{bucket}") if p)
        writer = DataFileWriter(
            target, directory, partition_path=ppath,
            partition_values=json.dumps([encode_partition_value(v) for v in values])
            if rec.partition_by else None,
            bucket=bucket,
            file_hook=lambda t: {"key_min": key_json(t.slice(0, 1), key),
                                 "key_max": key_json(t.slice(t.num_rows - 1, 1), key)},
            dictionary=dictionary)
        writers.append(writer)
        # The pool writes this run while the next one is cut.
        writer.write_all(run)
        written.append((writer, run))
    return written


def collect(table: Table, data: Any, *, where: str = "input") -> pa.Table:
    """The whole input conformed to the table schema (a run must be sorted, so it is held)."""
    batches = list(conformed(table, data, table.schema, where=where))
    if not batches:
        return table.schema.empty_table()
    return pa.Table.from_batches(batches, schema=table.schema)


def with_kinds(rows: pa.Table, kinds: pa.Array | RowKind) -> pa.Table:
    if isinstance(kinds, RowKind):
        kinds = pa.array(np.full(rows.num_rows, int(kinds), dtype=np.int8))
    return rows.append_column(ROW_KIND, kinds)


def commit_rows(table: Table, rows: pa.Table, kind: str, *, commit_id: str | None = None,
                summary: dict[str, Any] | None = None, base: int | None = None,
                on_rebase: Callable[[pa.Table], None] | None = None) -> WriteResult:
    """Write ``rows`` (with ``_row_kind``) as runs and commit them on ``base`` (the current
    snapshot when None), with the changelog the table's producer asks for; then compact if
    needed.

    ``on_rebase`` is the commit's conflict check (see :func:`conflict_on_touched_keys`). Once
    the commit has landed nothing raises: a failing compaction is logged and left for later.
    """
    if base is None:
        table.refresh()
        base = table.current_snapshot_id
    if rows.num_rows == 0:
        return WriteResult(None, kind)
    check_sequence_values(table, rows)
    logged: changelog.LookupChangelog | None = None
    if changelog.changelog_producer(table) == "lookup":
        # The lookup reads the new runs' rows, not their files: it runs while they are written.
        writers: list[DataFileWriter] = []
        try:
            written = _start_runs(table, rows, writers)
        except BaseException:
            for writer in writers:
                writer.abort()
            raise
        files, logged = changelog.finish_with_lookup(table, base, writers, written)
    else:
        files = write_runs(table, rows)
    result = changelog.commit_runs(table, kind, base, files, rows, commit_id=commit_id,
                                   summary=summary, on_rebase=on_rebase,
                                   lookup_changelog=logged)
    return compact_after_commit(table, result, files)


def compact_after_commit(table: Table, result: WriteResult, files: Sequence[NewFile]
                         ) -> WriteResult:
    """``result`` of a commit of runs ``files``, with the compaction of the buckets it touched
    that it triggered. The write has landed, so nothing here raises: a failing compaction is
    logged and left to the next write or ``compact()``."""
    if result.snapshot_id is None or result.duplicate:
        return result
    try:
        compacted = compact_if_needed(table, files)
    except Exception as exc:  # the write landed: it must not look failed to the caller
        _log.warning("Snapshot %s of %s committed, but compacting after it failed (the "
                     "next write or compact() retries): %s", result.snapshot_id,
                     table.name, exc)
        compacted = None
    return replace(result, compaction=compacted)


def check_sequence_values(table: Table, rows: pa.Table) -> None:
    """Refuse NaN in a floating-point ``sequence_field``: it has no order against numbers.

    Nulls are accepted and order before every value (oldest); among equal sequence values
    the later commit, and within one write the later row, is newer.
    """
    seq = sequence_field(table)
    if seq is None or seq not in rows.column_names:
        return
    column = rows.column(seq)
    if not pa.types.is_floating(column.type):
        return
    # Tombstones carry the stored row's value: only versions being added are checked.
    adding = pc.is_in(rows.column(ROW_KIND), value_set=pa.array(
        [RowKind.INSERT, RowKind.UPDATE_AFTER], pa.int8()))
    nans = pc.sum(pc.and_(adding, pc.is_nan(column))).as_py() or 0
    if nans:
        raise ValidationError(
            f"{nans} rows have NaN in sequence_field '{seq}' of table '{table.name}'; NaN has "
            "no order against other values. Give a number, or null (null orders oldest)")


def check_deletes_supported(table: Table, what: str) -> None:
    """Refuse a delete the table's merge engine would not carry out.

    ``first-row`` keeps the first version of a key forever, ``ignore-delete`` drops
    retractions, and ``aggregation`` subtracts a retraction unless
    ``aggregation.remove-record-on-delete`` is set: in all of them a ``-D`` does not remove
    the key, so ``delete()`` and ``when_matched_delete()`` would report rows as removed that
    stay. Change data (``write_changes``) keeps the engine's own retraction semantics.
    """
    engine = merge_engine(table)
    reason = None
    if isinstance(engine, FirstRow):
        reason = ("its merge engine is 'first-row', which keeps the first version of every key "
                  "and ignores retractions")
    elif isinstance(engine, (Deduplicate, PartialUpdate)) and engine.ignore_delete:
        reason = "it was created with ignore-delete, so retractions are dropped"
    elif isinstance(engine, Aggregation) and not engine.remove_record_on_delete:
        reason = ("its merge engine is 'aggregation', where a retraction only subtracts from "
                  "the aggregates; create the table with properties="
                  "{'aggregation.remove-record-on-delete': 'true'} to let deletes remove keys")
    if reason is not None:
        raise ValidationError(f"{what} cannot delete rows of table '{table.name}': {reason}")


def scan_at(table: Table, base: int | None, expr: Any) -> pa.Table:
    """The merged rows matching ``expr`` at snapshot ``base``, in the current schema."""
    if base is None:
        return table.schema.empty_table()
    return Scan.create(table._view(base, current_schema=True), expr, None, None,
                       table._merge_spec()).to_arrow()


#: How often a delete or merge re-plans on a newer snapshot before giving up.
REPLAN_ATTEMPTS = 5


def gave_up(what: str, table: Table, exc: CommitConflict) -> CommitConflict:
    return CommitConflict(
        f"{what} on table '{table.name}' was planned {REPLAN_ATTEMPTS} times and each time "
        f"another commit changed keys it read before it could commit ({exc}); the table is "
        "unchanged by it. Retry later, or serialize the writers of these keys")


def conflict_on_touched_keys(table: Table, keys: pa.Table, base: int | None,
                             expr: Expr | None = None) -> Callable[[pa.Table], None]:
    """An ``on_rebase`` check for a write planned on the rows of ``keys`` at ``base`` (and,
    with ``expr``, on which rows matched it: a delete by filter).

    An overwrite committed after ``base`` conflicts (it may only have removed files). Files
    committed after ``base`` whose sequence range ends at or below it are compaction rewrites
    of older runs: they change no row. Any other one (a new run) in a bucket of the touched
    keys, whose key range may hold one of them (compared on the first key column, a superset of
    the composite range), may have changed what the write read: :class:`CommitConflict`.
    With ``expr``, so does a new run whose statistics say it may hold a row matching
    ``expr``: a key that matches only since ``base`` must be deleted too.
    Nothing is computed unless the commit has to be rebased.
    """
    rec = table._record
    key = list(rec.primary_key)
    first_type = table.schema.field(key[0]).type
    after = -1 if base is None else base
    keys = keys.select(key)
    new_matches = _conflict_on_new_matches(table, expr) if expr is not None else None

    def first_values(texts: pa.ChunkedArray) -> pa.Array:
        return decode_values([None if t is None else json.loads(t)[0]
                              for t in texts.to_pylist()], first_type)

    def check(added: pa.Table) -> None:
        # The commits after ``base`` have all landed: this transaction holds the table.
        snaps = table._metastore.snapshots(rec.table_id).select(["snapshot_id", "kind"])
        later = snaps.filter(pc.greater(snaps.column("snapshot_id"), after))
        if pc.any(pc.equal(later.column("kind"), "overwrite")).as_py():
            raise CommitConflict(
                f"An overwrite committed after snapshot {base} on table '{table.name}' may have "
                "removed keys this write read; the table is unchanged")
        newer = pc.greater(pc.fill_null(added.column("seq_max"), np.iinfo(np.int64).max), after)
        new = added.filter(newer)
        if new.num_rows == 0:
            return
        if new_matches is not None:
            new_matches(new)
        # The touched keys' first column, grouped by bucket (one sort, then slices).
        buckets = bucket_of(keys, key, int(rec.buckets or DEFAULT_BUCKETS)).to_numpy()
        order = np.argsort(buckets, kind="stable")
        first = keys.column(key[0]).take(pa.array(order))
        sorted_buckets = buckets[order]
        lows, highs = first_values(new.column("key_min")), first_values(new.column("key_max"))
        # One step per new file (few: one per bucket a commit touched), vectorized over keys.
        for i, bucket in enumerate(new.column("bucket").to_pylist()):
            if bucket is None:
                values = first
            else:
                lo, hi = np.searchsorted(sorted_buckets, [bucket, bucket + 1])
                values = first.slice(int(lo), int(hi - lo))
            if len(values) == 0:
                continue
            inside = pa.array(np.ones(len(values), dtype=bool))
            if lows[i].is_valid:
                inside = pc.and_(inside, pc.greater_equal(values, lows[i]))
            if highs[i].is_valid:
                inside = pc.and_(inside, pc.less_equal(values, highs[i]))
            if pc.any(inside).as_py():
                raise CommitConflict(
                    f"A commit that landed after snapshot {base} wrote keys this write read "
                    f"on table '{table.name}'; the table is unchanged")

    return check


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
    return commit_rows(table, change_rows(table, data, row_kind), "changes", commit_id=commit_id)


def change_rows(table: Table, data: Any, row_kind: str = "op") -> pa.Table:
    """CDC rows conformed to the table schema, with their kinds as ``_row_kind`` codes."""

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
    return with_kinds(rows, codes)


def delete_keys(table: Table, expr: Any, *, commit_id: str | None = None) -> WriteResult:
    """Write tombstones for every key whose current row matches ``expr`` (no rewrite).

    The keys are found on one snapshot; the commit fails inside its transaction if a run
    committed since may hold one of them (:func:`conflict_on_touched_keys`), and the delete is
    then planned again on the newer snapshot, up to :data:`REPLAN_ATTEMPTS` times.
    """

    check_deletes_supported(table, "delete()")
    for attempt in range(REPLAN_ATTEMPTS):
        table.refresh()
        base = table.current_snapshot_id
        matched = scan_at(table, base, expr)
        if matched.num_rows == 0:
            return WriteResult(None, "delete")
        tombstones = with_kinds(matched, RowKind.DELETE)
        try:
            result = commit_rows(table, tombstones, "delete", commit_id=commit_id,
                                 summary={"deleted_rows": matched.num_rows}, base=base,
                                 on_rebase=conflict_on_touched_keys(table, matched, base, expr))
        except CommitConflict as exc:
            if attempt == REPLAN_ATTEMPTS - 1:
                raise gave_up("delete()", table, exc) from exc
            continue
        return replace(result, removed_rows=matched.num_rows, added_rows=0)
    raise AssertionError("unreachable")


def overwrite(table: Table, data: Any, expr: Any, *, commit_id: str | None = None
              ) -> WriteResult:
    """Replace the rows of whole partitions (or the whole table) of a primary-key table."""

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
    files = write_runs(table, with_kinds(rows, RowKind.INSERT)) if rows.num_rows else []
    return commit_overwrite(table, files, expr, added_rows=rows.num_rows, commit_id=commit_id)


def commit_overwrite(table: Table, files: list[NewFile], expr: Any, *, added_rows: int,
                     commit_id: str | None = None) -> WriteResult:
    """Commit runs already written while removing the files of the partitions ``expr`` selects
    (every file when it is always true); the runs are deleted if the commit does not happen."""
    rec = table._record
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
                               added_rows, change.removed_rows,
                               result.attempts, result.duplicate)
    except BaseException:
        _discard(table, files)
        raise
    raise AssertionError("unreachable")
