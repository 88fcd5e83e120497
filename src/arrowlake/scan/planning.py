"""Scan planning: from a snapshot and a filter to the files to read, then to splits.

Pruning runs in three steps, each cheaper than the reading it saves: partitions are matched
against the filter as a small Arrow table and only the matching partitions' files are fetched
from SQL; file statistics (min/max/null counts) prune the remaining files, vectorized over all of
them; Parquet row-group statistics are left to the reader. The exact filter is always applied to
what is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.expressions import (
    AlwaysTrue,
    Comparison,
    Expr,
    In,
    Literal,
    all_match,
    and_all,
    coerce_literal,
    conjuncts,
    may_match,
    referenced_columns,
)
from arrowlake.io.deletion_vectors import VectorRef
from arrowlake.io.stats import parse_stats, partition_table, stats_table
from arrowlake.io.storage import Storage
from arrowlake.merge.bucketing import buckets_for_keys
from arrowlake.merge.runs import KIND_FIELD, KIND_FIELD_ID, key_bounds_compare, key_range
from arrowlake.metastore.store import Metastore, TableRecord
from arrowlake.scan.grouping import consecutive_groups
from arrowlake.scan.split import FileTask, MergeSpec, Split

# More partition ids than this are not sent to SQL as an IN list; files are filtered in Arrow.
_MAX_SQL_PARTITIONS = 900


@dataclass(frozen=True)
class TableView:
    """What planning needs to know about a table at one snapshot."""

    metastore: Metastore
    storage: Storage
    record: TableRecord
    snapshot_id: int | None
    schema: pa.Schema  # the schema the snapshot is read in

    @property
    def location(self) -> str:
        return self.record.location


def _partition_ids(view: TableView, expr: Expr) -> list[int] | None:
    """Ids of the partitions that may hold matching rows, or None when all may."""
    part_cols = [c for c in view.record.partition_by]
    refs = referenced_columns(expr)
    if not part_cols or not refs & set(part_cols):
        return None
    rows = view.metastore.partitions(view.record.table_id)
    if not rows:
        return None
    parts = partition_table(rows, view.schema, part_cols)
    # Only the conjuncts on partition columns can be judged from partition values.
    on_parts = and_all([c for c in conjuncts(expr) if referenced_columns(c) <= set(part_cols)])
    if isinstance(on_parts, AlwaysTrue):
        return None
    mask = may_match(on_parts, parts, view.schema)
    ids = parts.column("partition_id").filter(mask)
    if len(ids) == len(parts):
        return None
    return [int(i) for i in ids.to_pylist()]


def key_buckets(view: TableView, expr: Expr) -> list[int] | None:
    """Buckets that can hold the keys a filter pins down with ``=`` or ``IN`` on every key
    column, or None when the filter does not pin the full key."""
    key = list(view.record.primary_key)
    buckets = view.record.buckets
    if not key or not buckets:
        return None
    values: dict[str, set[object]] = {}
    for c in conjuncts(expr):
        if isinstance(c, Comparison) and c.op == "=" and isinstance(c.right, Literal):
            name, vals = c.left.name, {c.right.value}
        elif isinstance(c, In):
            name, vals = c.column.name, set(c.values)
        else:
            continue
        if name in key:
            values[name] = values[name] & vals if name in values else vals
    if set(values) != set(key):
        return None
    combos = 1
    for v in values.values():
        combos *= len(v)
    if combos > 10_000:
        return None
    if combos == 0:
        return []
    types = [view.schema.field(k).type for k in key]
    try:
        rows = list(product(*[sorted(values[k], key=repr) for k in key]))
        coerced = [[_coerce(k, v, t) for k, v, t in zip(key, row, types, strict=True)]
                   for row in rows]
        return sorted(buckets_for_keys(coerced, types, key, buckets))
    except (ValueError, TypeError, pa.ArrowInvalid):
        return None


def _coerce(column: str, value: object, typ: pa.DataType) -> object:
    """A filter literal as a value of the key column's type (the bucket hash needs the type)."""
    scalar = coerce_literal(column, value, typ)
    if scalar.type != typ:
        raise TypeError(f"{value!r} is not a value of {typ}")
    return scalar.as_py()


def plan_files(view: TableView, expr: Expr) -> pa.Table:
    """The live files of the snapshot that may hold rows matching ``expr``.

    For primary-key tables only the conjuncts on key columns prune: they keep or drop every
    version of a key together, while pruning by another column could hide a newer version and
    resurrect an older one. Equality and IN on the full key prune buckets in SQL.
    """
    buckets = None
    if view.record.primary_key:
        keys = set(view.record.primary_key)
        if view.record.deletion_vectors:
            # Every key lives in one live row: a file whose statistics rule a filter out holds
            # no current version that matches it, so any column prunes (statistics count the
            # deleted rows too, which only keeps more files).
            return _prune_by_stats(view, expr, key_buckets(view, expr))
        expr = and_all([c for c in conjuncts(expr) if referenced_columns(c) <= keys])
        buckets = key_buckets(view, expr)
    return _prune_by_stats(view, expr, buckets)


def _prune_by_stats(view: TableView, expr: Expr, buckets: list[int] | None) -> pa.Table:
    part_ids = _partition_ids(view, expr)
    if part_ids is not None and len(part_ids) > _MAX_SQL_PARTITIONS:
        files = view.metastore.live_files(view.record.table_id, view.snapshot_id,
                                          buckets=buckets)
        files = files.filter(pc.is_in(files.column("partition_id"),
                                      pa.array(part_ids, pa.int64())))
    else:
        files = view.metastore.live_files(view.record.table_id, view.snapshot_id, part_ids,
                                          buckets=buckets)
    if isinstance(expr, AlwaysTrue) or files.num_rows == 0:
        return files
    stat_cols = [c for c in sorted(referenced_columns(expr)) if c in view.schema.names]
    if not stat_cols:
        return files
    stats = file_stats(files, view.schema, stat_cols)
    return files.filter(may_match(expr, stats, view.schema))


def file_stats(files: pa.Table, schema: pa.Schema, columns: Sequence[str]) -> pa.Table:
    return stats_table(files.column("stats").to_pylist(), files.column("row_count"), schema,
                       columns)


def fully_matching(view: TableView, files: pa.Table, expr: Expr) -> pa.Array:
    """Per file: True where statistics prove every row matches ``expr``."""
    if isinstance(expr, AlwaysTrue):
        return pa.array([True] * files.num_rows)
    cols = [c for c in sorted(referenced_columns(expr)) if c in view.schema.names]
    stats = file_stats(files, view.schema, cols)
    return all_match(expr, stats, view.schema)


def file_tasks(view: TableView, files: pa.Table) -> list[FileTask]:
    loc = view.location
    join = view.storage.join
    n = files.num_rows
    cols = files.select(["file_id", "path", "file_size", "row_count", "schema_id", "bucket",
                         "seq_min", "seq_max", "partition_id"]).to_pydict()
    part_values: list[str | None] = [None] * n
    if view.record.partition_by and n:
        values = {pid: json_values for pid, _, json_values
                  in view.metastore.partitions(view.record.table_id)}
        part_values = [values.get(pid) if pid is not None else None
                       for pid in cols["partition_id"]]
    ranges: list[tuple[tuple[Any, ...], tuple[Any, ...]] | None] = [None] * n
    additions = [False] * n
    deletes: list[VectorRef | None] = [None] * n
    if view.record.primary_key and n:
        ranges, additions = _run_facts(view, files)
    if view.record.deletion_vectors and n:
        deletes = file_vectors(view, cols["file_id"])
    return [
        FileTask(fid, join(loc, path), size, rows, sid, bucket, smin, smax, pid, key_range,
                 adds, pvalues, dv)
        for fid, path, size, rows, sid, bucket, smin, smax, pid, key_range, adds, pvalues, dv
        in zip(cols["file_id"], cols["path"], cols["file_size"], cols["row_count"],
               cols["schema_id"], cols["bucket"], cols["seq_min"], cols["seq_max"],
               cols["partition_id"], ranges, additions, part_values, deletes, strict=True)
    ]


def file_vectors(view: TableView, file_ids: Sequence[int]) -> list[VectorRef | None]:
    """The deletion vector of each file at the view's snapshot (None where it has none)."""
    found = view.metastore.live_vectors(view.record.table_id, view.snapshot_id, file_ids)
    join, loc = view.storage.join, view.location
    return [None if (v := found.get(fid)) is None else VectorRef(
                v.cardinality, v.blob, None if v.puffin_path is None else join(loc, v.puffin_path),
                v.blob_offset or 0, v.blob_length or 0, v.added_snapshot)
            for fid in file_ids]


def _run_facts(view: TableView, files: pa.Table
               ) -> tuple[list[tuple[tuple[Any, ...], tuple[Any, ...]] | None], list[bool]]:
    """Per primary-key run: its key range (None when the key's stored values do not compare
    in Python like in Arrow) and whether it holds only additions, so readers can skip merging
    runs that no other run overlaps. From the metastore: no data is read."""
    key_types = [view.schema.field(k).type for k in view.record.primary_key
                 if k in view.schema.names]
    comparable = (len(key_types) == len(view.record.primary_key)
                  and key_bounds_compare(key_types))
    kind_id = str(KIND_FIELD_ID)
    ranges: list[tuple[tuple[Any, ...], tuple[Any, ...]] | None] = []
    additions: list[bool] = []
    for stats, low, high in zip(files.column("stats").to_pylist(),
                                files.column("key_min").to_pylist(),
                                files.column("key_max").to_pylist(), strict=True):
        kinds = parse_stats(stats).get(kind_id) if stats else None
        # Runs hold +I (0), +U (2), -D (3) and restarts (4): a maximum of 2 means additions.
        additions.append(kinds is not None and kinds[1] is not None and kinds[1] <= 2
                         and kinds[0] != 1)
        ranges.append(key_range(low, high) if comparable else None)
    return ranges, additions


def file_schemas(view: TableView, tasks: Sequence[FileTask]) -> dict[int, pa.Schema]:
    ids = sorted({t.schema_id for t in tasks})
    return {sid: view.metastore.schema(view.record.table_id, sid) for sid in ids}


def group_tasks(tasks: Sequence[FileTask], *, whole_buckets: bool,
                target_bytes: int) -> list[list[FileTask]]:
    """``tasks`` packed into groups of about ``target_bytes``, in order; with
    ``whole_buckets`` a (partition, bucket) is never divided, so one key's versions stay in one
    group."""
    if whole_buckets:
        by_bucket: dict[tuple[int | None, int | None], list[FileTask]] = {}
        for task in tasks:
            by_bucket.setdefault((task.partition_id, task.bucket), []).append(task)
        units = list(by_bucket.values())
    else:
        units = [[task] for task in tasks]
    return [[task for unit in group for task in unit] for group in consecutive_groups(
        units, lambda unit: sum(t.file_size for t in unit), target_bytes)]


def make_splits(
    view: TableView,
    tasks: Sequence[FileTask],
    *,
    columns: Sequence[str],
    expr: Expr,
    target_bytes: int,
    merge: MergeSpec | None = None,
    limit: int | None = None,
) -> list[Split]:
    """Pack files into splits of about ``target_bytes``.

    Primary-key tables split by bucket: a split holds whole buckets, so one key's versions are
    never divided between splits.
    """
    schemas = file_schemas(view, tasks)
    if merge is not None:
        # Data files of primary-key tables carry the row-kind column besides the table's.
        schemas = {sid: s.append(KIND_FIELD) for sid, s in schemas.items()}
    groups = group_tasks(tasks, whole_buckets=merge is not None, target_bytes=target_bytes)
    return [
        Split(view.storage, tuple(group), {sid: schemas[sid] for sid in {t.schema_id
                                                                          for t in group}},
              view.schema, tuple(columns), expr, limit, merge,
              partition_by=tuple(view.record.partition_by), table=view.record.full_name)
        for group in groups
    ]
