"""Merge-on-read of primary-key tables, inside the IO layer.

A split of a primary-key table holds whole buckets. Each bucket's runs are read (only the needed
columns; filters on key columns pushed down, since they keep or drop all versions of a key
together), tagged with the sequence of the commit that wrote them, and merged by the table's
merge engine. Filters on other columns are applied after the merge: pruning by them could
resurrect an older version of a key. Buckets are merged on a small thread pool, one ahead of the
consumer, so memory stays around two buckets.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pyarrow as pa

from arrowlake.expressions import AlwaysTrue, Expr, and_all, conjuncts, referenced_columns
from arrowlake.scan.read import limited, read_split_table
from arrowlake.scan.split import FileTask, MergeSpec, Split
from arrowlake.table.merging import ROW_KIND, SEQUENCE

KIND_COLUMN = "_al_row_kind"


def split_filter(expr: Expr, key: Sequence[str]) -> tuple[Expr, Expr]:
    """``(key-only conjuncts, the rest)`` of a filter."""
    keys = set(key)
    on_key: list[Expr] = []
    rest: list[Expr] = []
    for c in conjuncts(expr):
        (on_key if referenced_columns(c) <= keys else rest).append(c)
    return and_all(on_key), and_all(rest)


def bucket_groups(files: Sequence[FileTask]) -> list[list[FileTask]]:
    groups: dict[tuple[int | None, int | None], list[FileTask]] = {}
    for f in files:
        groups.setdefault((f.partition_id, f.bucket), []).append(f)
    return list(groups.values())


def read_runs(split: Split, files: Sequence[FileTask], columns: Sequence[str],
              pushed: Expr) -> pa.Table:
    """The rows of ``files`` with ``_row_kind`` and ``_seq`` (the writing commit's sequence)."""
    from arrowlake.table.primary_key import KIND_FIELD

    schema = split.schema if KIND_COLUMN in split.schema.names else split.schema.append(
        KIND_FIELD)
    wanted = [*columns, KIND_COLUMN]
    tables = []
    for f in files:
        one = Split(split.storage, (f,), split.file_schemas, schema, tuple(wanted), pushed,
                    batch_size=split.batch_size)
        tables.append(read_split_table(one))
    lengths = np.array([t.num_rows for t in tables], dtype=np.int64)
    seqs = np.array([f.seq_max if f.seq_max is not None else 0 for f in files], dtype=np.int64)
    rows = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    rows = rows.rename_columns([ROW_KIND if c == KIND_COLUMN else c for c in rows.column_names])
    return rows.append_column(SEQUENCE, pa.array(np.repeat(seqs, lengths)))


def merge_bucket(split: Split, files: Sequence[FileTask], columns: Sequence[str],
                 pushed: Expr, keep_retractions: bool = False) -> pa.Table:
    """One bucket's current rows (with ``_row_kind`` and ``_seq``), merged."""
    spec = split.merge
    assert spec is not None
    rows = read_runs(split, files, columns, pushed)
    return spec.engine.merge(rows, list(spec.key), spec.sequence_field, keep_retractions)


def _needed(split: Split, spec: MergeSpec, residual: Expr) -> list[str]:
    needed = list(split.columns)
    extra = [*spec.key, *sorted(referenced_columns(residual))]
    if spec.sequence_field:
        extra.append(spec.sequence_field)
    for c in extra:
        if c not in needed:
            needed.append(c)
    return needed


def read_merged(split: Split) -> Iterator[pa.RecordBatch]:
    """Yield the merged rows of a primary-key split, bucket by bucket."""
    spec = split.merge
    assert spec is not None
    pushed, residual = split_filter(split.filter, spec.key)
    needed = _needed(split, spec, residual)
    out_schema = split.output_schema()
    groups = bucket_groups(split.files)

    def work(files: list[FileTask]) -> pa.Table:
        merged = merge_bucket(split, files, needed, pushed)
        if not isinstance(split.filter, AlwaysTrue):
            merged = merged.filter(split_residual(residual, merged))
        return merged.select(list(split.columns)).cast(out_schema)

    def merged_tables() -> Iterator[pa.Table]:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="arrowlake-merge") as pool:
            ahead: deque[Future[pa.Table]] = deque()
            try:
                for files in groups:
                    ahead.append(pool.submit(work, files))
                    if len(ahead) > 1:
                        yield ahead.popleft().result()
                while ahead:
                    yield ahead.popleft().result()
            finally:
                for future in ahead:
                    future.cancel()

    batches = (b for t in merged_tables() for b in t.to_batches(max_chunksize=split.batch_size))
    yield from limited(batches, split.limit)


def split_residual(residual: Expr, merged: pa.Table) -> pa.Array:
    from arrowlake.expressions import evaluate

    if isinstance(residual, AlwaysTrue):
        return pa.array(np.ones(merged.num_rows, dtype=bool))
    return evaluate(residual, merged)


def with_merge(split: Split, merge: MergeSpec) -> Split:
    return replace(split, merge=merge)
