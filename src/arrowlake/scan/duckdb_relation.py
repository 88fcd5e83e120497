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
- partition columns are read from the files, which store them too.

What DuckDB cannot read with the same result goes through arrowlake's Arrow reader, and its
rows (read when the relation is made) are unioned in: buckets of primary-key tables that need
merging, schema versions with a column DuckDB reads as another type (durations, nested types
whose fields changed), filters with no exact SQL form (then the whole scan), and files DuckDB
cannot open by path (object stores: DuckDB's httpfs is not configured from arrowlake's storage
options; file paths with glob characters).
"""

from __future__ import annotations

from collections.abc import Sequence
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
from arrowlake.io.storage import LocalStorage
from arrowlake.scan.read import bucket_groups, needs_merge, read_split_table
from arrowlake.scan.split import FileTask, Split
from arrowlake.schema import RESERVED_PREFIX, can_widen, field_id

#: Characters ``read_parquet`` takes as a glob in a path; such files are read with Arrow.
_GLOB = frozenset("*?[{")
#: Names of the file index and row number columns (in arrowlake's reserved prefix, which no
#: table column has); the deleted positions' columns add ``_d``.
_FILE_INDEX = f"{RESERVED_PREFIX}file"
_ROW_NUMBER = f"{RESERVED_PREFIX}row"
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
    needed = list(split.columns)
    used = set() if isinstance(split.filter, AlwaysTrue) else referenced_columns(split.filter)
    needed += sorted(used - set(needed))
    duckdb = require("duckdb", "duckdb", "Scan.to_duckdb()")
    try:
        probe = con.from_arrow(pa.schema([split.schema.field(n) for n in needed]).empty_table())
        targets = dict(zip(needed, (str(t) for t in probe.types), strict=True))
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
    parts = []
    grouped: dict[int, list[FileTask]] = {}
    for f in files:
        grouped.setdefault(f.schema_id, []).append(f)
    for schema_id, group in grouped.items():
        try:
            relations = _group_relations(con, split, schema_id, group, needed, targets, where)
        except duckdb.Error:  # DuckDB refused the SQL while binding it: nothing was read
            relations = None
        if relations is None:
            by_arrow.extend(group)
        else:
            parts.extend(relations)
    if by_arrow:
        rows = read_split_table(replace(split, files=tuple(by_arrow)))
        parts.append(con.from_arrow(rows))
    relation = parts[0]
    for part in parts[1:]:
        relation = relation.union(part)
    return relation if split.limit is None else relation.limit(split.limit)


def _select_list(con: Any, split: Split, schema_id: int, files: Sequence[FileTask],
                 needed: Sequence[str], targets: dict[str, str]) -> str | None:
    """The SQL select list giving the ``needed`` columns of files written in schema version
    ``schema_id`` as the table's columns (matched by field id), or None when some column
    cannot be brought to its DuckDB type with the values Arrow gives."""
    file_schema = split.file_schemas[schema_id]
    by_id = {field_id(f): f for f in file_schema}
    # The types DuckDB reads the files' columns as (binding reads one footer).
    read = con.sql(f"SELECT * FROM read_parquet({_path_list(split, files[:1])})")
    stored = dict(zip(read.columns, (str(t) for t in read.types), strict=True))
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


def _group_relations(con: Any, split: Split, schema_id: int, files: Sequence[FileTask],
                     needed: Sequence[str], targets: dict[str, str], where: str | None
                     ) -> list[Any] | None:
    """Relations of the live rows of files written in schema version ``schema_id``, filtered
    by ``where`` and with the split's columns: one of the files without deleted rows, one of
    those with (anti-joined with their deleted positions). None when DuckDB cannot read the
    files' columns as the table's (see :func:`_select_list`)."""
    select = _select_list(con, split, schema_id, files, needed, targets)
    if select is None:
        return None
    whole = [f for f in files if f.deletes is None or not f.deletes.cardinality]
    masked = [f for f in files if f.deletes is not None and f.deletes.cardinality]
    out = []
    if whole:
        out.append(con.sql(f"SELECT {select} FROM read_parquet({_path_list(split, whole)})"))
    if masked:
        file_col, row_col = _FILE_INDEX, _ROW_NUMBER
        rows = con.sql(
            f"SELECT {select}, file_index AS {quote_identifier(file_col)}, "
            f"file_row_number AS {quote_identifier(row_col)} "
            f"FROM read_parquet({_path_list(split, masked)}, file_row_number=true)")
        deleted = con.from_arrow(_deleted_positions(split, masked, file_col + "_d",
                                                    row_col + "_d"))
        condition = (f"{quote_identifier(file_col)} = {quote_identifier(file_col + '_d')} "
                     f"AND {quote_identifier(row_col)} = {quote_identifier(row_col + '_d')}")
        live = rows.join(deleted, condition, how="anti")
        out.append(live.project(", ".join(quote_identifier(c) for c in needed)))
    if where is not None:
        out = [rel.filter(where) for rel in out]
    if list(needed) != list(split.columns):
        columns = ", ".join(quote_identifier(c) for c in split.columns)
        out = [rel.project(columns) for rel in out]
    return out


def _deleted_positions(split: Split, files: Sequence[FileTask], file_col: str,
                       row_col: str) -> pa.Table:
    """``(index in files, position)`` of every deleted row of ``files``."""
    vectors = [f.deletes.positions(split.storage, f.path) for f in files if f.deletes]
    counts = np.array([v.size for v in vectors], dtype=np.int64)
    index = np.repeat(np.arange(len(vectors), dtype=np.uint64), counts)  # as file_index
    positions = np.concatenate(vectors).astype(np.int64) if vectors else np.empty(0, np.int64)
    return pa.table({file_col: index, row_col: positions})
