"""The changes of one snapshot of a merge-on-write (deletion-vector) table.

Such a snapshot adds files holding the new versions of the keys it wrote, and extends the
deletion vectors of the files holding their old versions. Its change is therefore exact
without any changelog file: the rows at the positions it newly deleted are what it retracted,
the rows of the files it added are what it added. Pairing them by key gives ``-U``/``+U`` for
a replaced key (each ``-U`` directly before its ``+U``), ``-D`` for a deleted one and ``+I`` for
a new one; a key written again with all its values unchanged gives nothing.

An overwrite of partitions removes files instead: their live rows (as of the snapshot
before) are retracted the same way.

A :class:`VectorChangeSplit` covers some partitions and buckets of one snapshot (a key's old
and new rows are always in the same one) and is picklable, like every change split.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.expressions import AlwaysTrue, Expr, evaluate
from arrowlake.io.deletion_vectors import VectorRef
from arrowlake.io.storage import Storage
from arrowlake.merge import RowKind
from arrowlake.merge.equality import same_rows
from arrowlake.scan.split import FileTask, Split
from arrowlake.streaming.splits import KIND_NAMES, ROW_KIND_FIELD, no_columns
from arrowlake.table.keys.lookup import match_keys, rows_at


@dataclass(frozen=True)
class VectorChangeSplit:
    """Rows a snapshot retracted (``gone``: each file as of the snapshot before, with the
    positions the snapshot deleted) and added (``added``: its new files), labelled by key."""

    storage: Storage
    gone: tuple[tuple[FileTask, VectorRef], ...]
    file_schemas: Mapping[int, pa.Schema]
    added: Split | None
    removed: Split | None  # files the snapshot removed (an overwrite): their live rows
    schema: pa.Schema  # the table schema at the snapshot
    key: tuple[str, ...]
    columns: tuple[str, ...]
    include_row_kind: bool
    filter: Expr

    @property
    def row_count(self) -> int:
        return sum(v.cardinality for _, v in self.gone) + sum(
            s.row_count for s in (self.added, self.removed) if s is not None)

    def output_schema(self) -> pa.Schema:
        schema = pa.schema([self.schema.field(c) for c in self.columns])
        return schema.append(ROW_KIND_FIELD) if self.include_row_kind else schema

    def _retracted(self) -> pa.Table:
        names = list(self.schema.names)
        parts = [rows_at(self.storage, task, self.file_schemas[task.schema_id], self.schema,
                         names, ref.positions(self.storage, task.path).astype(np.int64))
                 for task, ref in self.gone]
        if self.removed is not None:
            parts.append(self.removed.to_arrow().cast(self.schema))
        return pa.concat_tables(parts) if parts else self.schema.empty_table()

    def to_arrow(self) -> pa.Table:
        before = self._retracted()
        after = self.added.to_arrow() if self.added is not None else \
            self.schema.empty_table()
        at_after, at_before = match_keys(after, before, list(self.key))
        replaced_before = np.zeros(before.num_rows, dtype=bool)
        replaced_before[at_before] = True
        replaced_after = np.zeros(after.num_rows, dtype=bool)
        replaced_after[at_after] = True
        # A key written again with every value as it was is no change (as the lookup
        # producer of merge-on-read tables and the net change of catch-up have it).
        same = same_rows(before.take(pa.array(at_before)),
                         after.take(pa.array(at_after)).cast(before.schema))
        at_after, at_before = at_after[~same], at_before[~same]
        deleted = np.flatnonzero(~replaced_before)
        inserted = np.flatnonzero(~replaced_after)
        # -D rows, then each -U directly before its +U, then +I rows.
        rows = pa.concat_tables([
            before.take(pa.array(deleted)),
            _interleave(before.take(pa.array(at_before)), after.take(pa.array(at_after))),
            after.take(pa.array(inserted)),
        ])
        pairs = len(at_before)
        kinds = np.concatenate([
            np.full(len(deleted), int(RowKind.DELETE), np.int8),
            np.tile(np.array([int(RowKind.UPDATE_BEFORE), int(RowKind.UPDATE_AFTER)], np.int8),
                    pairs),
            np.full(len(inserted), int(RowKind.INSERT), np.int8)])
        if not isinstance(self.filter, AlwaysTrue):
            keep = pc.fill_null(evaluate(self.filter, rows), False)
            rows, kinds = rows.filter(keep), kinds[keep.to_numpy(zero_copy_only=False)]
        arrays = [rows.column(c) for c in self.columns]
        if self.include_row_kind:
            arrays.append(pc.take(KIND_NAMES, pa.array(kinds)))
        if not arrays:  # columns=[]: the rows, with no columns
            return no_columns(rows.num_rows)
        return pa.Table.from_arrays(arrays, schema=self.output_schema())

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        yield from self.to_arrow().to_batches()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_arrow().__arrow_c_stream__(requested_schema)


def _interleave(first: pa.Table, second: pa.Table) -> pa.Table:
    """Rows ``first[0], second[0], first[1], second[1], ...`` (equal lengths)."""
    n = first.num_rows
    order = np.empty(2 * n, dtype=np.int64)
    order[0::2] = np.arange(n)
    order[1::2] = np.arange(n) + n
    both = pa.concat_tables([first, second.cast(first.schema)])
    return both.take(pa.array(order))
