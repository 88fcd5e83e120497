"""``Scan.to_duckdb()``: a lazy DuckDB relation over the scan's Parquet files.

DuckDB reads the planned files itself (``read_parquet``), so nothing is read when the relation
is made and DuckDB's own pruning, parallelism and pushdown apply. The relation holds exactly the
rows :meth:`Scan.to_arrow` returns:

- files are grouped by the schema version they were written in; each group's columns are
  found by field id and renamed, widened (``CAST``) or added (``NULL``) as the Arrow reader does
  (:mod:`arrowlake.scan.read`), into the DuckDB types DuckDB gives the Arrow columns;
- files with a deletion vector are read with ``file_row_number`` and anti-joined with a small
  Arrow table of their deleted ``(file, position)`` pairs, built from the vectors;
- the filter becomes SQL (:mod:`arrowlake.expressions.duckdb_sql`) over the mapped columns;
- partition columns are read from the files, which store them too (not from the
  ``name=value`` directories DuckDB would otherwise decode).

What DuckDB cannot read with the same result goes through arrowlake's Arrow reader, and its
rows (read when the relation is made) are unioned in: buckets of primary-key tables that need
merging, schema versions with a column DuckDB reads as another type (durations, nested types
whose fields changed), filters with no exact SQL form (then the whole scan), and files DuckDB
cannot open by path (object stores: DuckDB's httpfs is not configured from arrowlake's storage
options; file paths with glob characters).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from arrowlake.errors import ValidationError, require
from arrowlake.expressions import AlwaysTrue, referenced_columns
from arrowlake.expressions.binding import value_type
from arrowlake.expressions.duckdb_sql import (
    duckdb_type,
    quote_identifier,
    quote_string,
    to_duckdb_sql,
)
from arrowlake.io.lru import SizedLRU
from arrowlake.io.storage import LocalStorage
from arrowlake.scan.read import bucket_groups, needs_merge, read_split_table
from arrowlake.scan.split import FileTask, Split
from arrowlake.schema import RESERVED_PREFIX, can_widen, field_id

#: Characters ``read_parquet`` takes as a glob in a path; such files are read with Arrow.
_GLOB = frozenset("*?[{")
#: Names of the file index and row number columns (in arrowlake's reserved prefix, which no
#: table column has).
_FILE_INDEX = f"{RESERVED_PREFIX}file"
_ROW_NUMBER = f"{RESERVED_PREFIX}row"
#: Columns come from the files only: DuckDB would otherwise take partition columns from
#: ``name=value`` directories, whose text (escaped, ``(null)``) is not the stored value.
_OPTIONS = ", hive_partitioning=false, union_by_name=false"
#: The columns of the table of deleted positions (file index, row number).
_DELETED_FILE = f"{RESERVED_PREFIX}deleted_file"
_DELETED_ROW = f"{RESERVED_PREFIX}deleted_row"
#: DuckDB types whose widening casts (int32 -> int64, float -> double, decimal precision up)
#: give the values Arrow's casts give.
_NUMERIC = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT",
                      "UINTEGER", "UBIGINT", "FLOAT", "DOUBLE"})


def duckdb_relation(con: Any, split: Split | None, schema: pa.Schema) -> Any:
    """The rows of ``split`` (a whole scan's one split, None when no file matches) as a lazy
    relation of ``con`` with the columns of ``schema``."""
    if not schema.names:
        raise ValidationError(
            "A DuckDB relation needs at least one column, and this scan selects none "
            "(columns=[]): select a column, or count the rows with scan.count()")
    if split is None:
        return con.from_arrow(schema.empty_table())
    duckdb = require("duckdb", "duckdb", "Scan.to_duckdb()")
    needed = list(split.columns)
    used = set() if isinstance(split.filter, AlwaysTrue) else referenced_columns(split.filter)
    needed += sorted(used - set(needed))
    try:
        targets = _duckdb_types(con, pa.schema([split.schema.field(n) for n in needed]))
    except duckdb.Error:  # DuckDB cannot hold a column type (float16, decimal256, ...)
        return con.from_arrow(read_split_table(split))  # fails as DuckDB fails on it
    where = None
    if used:
        # DuckDB types a relation's columns as it types Arrow ones: bind the filter there.
        where = to_duckdb_sql(split.filter, split.schema)
    readable = isinstance(split.storage, LocalStorage) and not any(
        _GLOB & set(f.path) for f in split.files)
    if (used and where is None) or not readable:
        return con.from_arrow(read_split_table(split))

    files = list(split.files)
    by_arrow: list[FileTask] = []
    if split.merge is not None:
        # Buckets whose runs must be merged go through arrowlake's merged read.
        groups = bucket_groups(files)
        by_arrow = [f for g in groups if needs_merge(g) for f in g]
        files = [f for g in groups if not needs_merge(g) for f in g]
    grouped: dict[int, list[FileTask]] = {}
    for f in files:
        grouped.setdefault(f.schema_id, []).append(f)
    selects: list[tuple[list[FileTask], str]] = []
    for schema_id, group in grouped.items():
        try:
            select = _select_list(con, split, schema_id, group, needed, targets)
        except duckdb.Error:  # DuckDB cannot open these files by path
            select = None
        if select is None:
            by_arrow.extend(group)
        else:
            selects.append((group, select))
    relation = _files_relation(con, split, selects, where)
    if by_arrow:
        rows = con.from_arrow(read_split_table(replace(split, files=tuple(by_arrow))))
        relation = rows if relation is None else relation.union(rows)
    assert relation is not None
    return relation if split.limit is None else relation.limit(split.limit)


def _has_deletes(task: FileTask) -> bool:
    return task.deletes is not None and task.deletes.cardinality > 0


def _select_list(con: Any, split: Split, schema_id: int, files: Sequence[FileTask],
                 needed: Sequence[str], targets: dict[str, str]) -> str | None:
    """The SQL select list giving the ``needed`` columns of files written in schema version
    ``schema_id`` as the table's columns (matched by field id), or None when some column
    cannot be brought to its DuckDB type with the values Arrow gives."""
    file_schema = split.file_schemas[schema_id]
    by_id = {field_id(f): f for f in file_schema}
    stored = _stored_types(con, split, files[0])
    items = []
    for name in needed:
        field = split.schema.field(name)
        target = targets[name]
        old = by_id.get(field_id(field))
        out = quote_identifier(name)
        if old is None:  # added after these files were written
            items.append(f"CAST(NULL AS {target}) AS {out}")
            continue
        if old.name not in stored:
            return None
        column = quote_identifier(old.name)
        if not _castable(old.type, field.type, stored[old.name], target):
            return None
        if stored[old.name] != target:
            column = f"CAST({column} AS {target})"
        items.append(column if old.name == name and column == out else f"{column} AS {out}")
    return ", ".join(items)


#: DuckDB types by file (path, size) and by Arrow schema, at most 1024 of each.
_STORED: SizedLRU[dict[str, str]] = SizedLRU(1024, lambda _: 1)
_TARGETS: SizedLRU[dict[str, str]] = SizedLRU(1024, lambda _: 1)
os.register_at_fork(after_in_child=_STORED.after_fork)
os.register_at_fork(after_in_child=_TARGETS.after_fork)


def _cached(cache: SizedLRU[dict[str, str]], key: Any,
            make: Callable[[], dict[str, str]]) -> dict[str, str]:
    found = cache.get(key)
    if found is None:
        found = make()
        cache.put(key, found)
    return found


def _stored_types(con: Any, split: Split, task: FileTask) -> dict[str, str]:
    """The DuckDB type of each column of ``task``'s file as ``read_parquet`` reads it (one
    footer; kept per file, as data files never change)."""
    def read() -> dict[str, str]:
        rel = con.sql(f"SELECT * FROM read_parquet({_path_list(split, [task])}{_OPTIONS})")
        return dict(zip(rel.columns, (str(t) for t in rel.types), strict=True))

    return _cached(_STORED, (task.path, task.file_size), read)


def _duckdb_types(con: Any, schema: pa.Schema) -> dict[str, str]:
    """The DuckDB type of each column of ``schema`` as DuckDB reads an Arrow table of it."""
    def read() -> dict[str, str]:
        rel = con.from_arrow(schema.empty_table())
        return dict(zip(schema.names, (str(t) for t in rel.types), strict=True))

    return _cached(_TARGETS, schema, read)


def _castable(file_type: pa.DataType, table_type: pa.DataType, stored: str,
              target: str) -> bool:
    """Whether DuckDB's ``CAST`` of a column it reads as ``stored`` to ``target`` gives the
    values Arrow's read of the file's ``file_type`` column as ``table_type`` gives."""
    if stored == target:
        return True
    if duckdb_type(file_type) != stored:
        # DuckDB reads the file's column as another type than Arrow's: only timestamps of
        # seconds or milliseconds (read as microseconds, exactly) come back unchanged.
        t = value_type(file_type)
        return (stored == "TIMESTAMP" and pa.types.is_timestamp(t) and t.tz is None
                and file_type == table_type and target == duckdb_type(t))
    numeric = (stored in _NUMERIC or stored.startswith("DECIMAL(")) and (
        target in _NUMERIC or target.startswith("DECIMAL("))
    return numeric and can_widen(value_type(file_type), value_type(table_type))


def _path_list(split: Split, files: Sequence[FileTask]) -> str:
    return "[" + ", ".join(quote_string(split.storage.fs_path(f.path)) for f in files) + "]"


def _files_relation(con: Any, split: Split, selects: Sequence[tuple[list[FileTask], str]],
                    where: str | None) -> Any:
    """A relation of the live rows of the files DuckDB reads (``selects``: each schema
    version's files and select list) with the split's columns, filtered by ``where``, or None
    without files: the files without deleted rows in one statement; those with them in
    another, with their file index and row number, anti-joined once with a small Arrow table
    of their deleted positions. Built with DuckDB's relation API, whose every step binds the
    relation again, in as few steps as that: a statement over an Arrow table
    (``relation.query``) takes about 2 ms more to bind."""
    columns = ", ".join(quote_identifier(c) for c in split.columns)
    condition = "" if where is None else f" WHERE {where}"
    file_col, row_col = quote_identifier(_FILE_INDEX), quote_identifier(_ROW_NUMBER)
    whole_queries, masked_queries = [], []
    masked: list[FileTask] = []  # numbered across the schema versions
    for files, select in selects:
        whole = [f for f in files if not _has_deletes(f)]
        if whole:
            whole_queries.append(
                f"SELECT {columns} FROM (SELECT {select} FROM "
                f"read_parquet({_path_list(split, whole)}{_OPTIONS})){condition}")
        with_deletes = [f for f in files if _has_deletes(f)]
        if with_deletes:
            masked_queries.append(
                f"SELECT * FROM (SELECT {select}, file_index + {len(masked)} AS {file_col}, "
                f"file_row_number AS {row_col} "
                f"FROM read_parquet({_path_list(split, with_deletes)}{_OPTIONS}, "
                f"file_row_number=true)){condition}")
            masked += with_deletes
    relation = con.sql(" UNION ALL ".join(whole_queries)) if whole_queries else None
    if masked_queries:
        deleted = con.from_arrow(_deleted_positions(split, masked))
        # The positions' columns have names of their own: the condition needs no aliases.
        on = (f"{file_col} = {quote_identifier(_DELETED_FILE)} AND "
              f"{row_col} = {quote_identifier(_DELETED_ROW)}")
        live = con.sql(" UNION ALL ".join(masked_queries)).join(deleted, on, how="anti") \
            .project(columns)
        relation = live if relation is None else relation.union(live)
    return relation


def _deleted_positions(split: Split, files: Sequence[FileTask]) -> pa.Table:
    """``(index in files, position)`` of every deleted row of ``files``."""
    vectors = [f.deletes.positions(split.storage, f.path) for f in files if f.deletes]
    counts = np.array([v.size for v in vectors], dtype=np.int64)
    index = np.repeat(np.arange(len(vectors), dtype=np.uint64), counts)  # as file_index
    positions = np.concatenate(vectors).astype(np.int64) if vectors else np.empty(0, np.int64)
    return pa.table({_DELETED_FILE: index, _DELETED_ROW: positions})
