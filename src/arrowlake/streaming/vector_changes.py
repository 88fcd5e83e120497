"""The changes of one snapshot of a merge-on-write (deletion-vector) table.

Such a snapshot adds files holding the new versions of the keys it wrote, and extends the
deletion vectors of the files holding their old versions. Its change is therefore exact
without any changelog file: the rows at the positions it newly deleted are what it retracted,
the rows of the files it added are what it added. Pairing them by key gives ``-U``/``+U`` for
a replaced key (each ``-U`` directly before its ``+U``), ``-D`` for a deleted one and ``+I`` for
a new one; a key written again with all its values unchanged gives nothing.

An overwrite of partitions removes files instead: their live rows (as of the snapshot
before) are retracted the same way.

The pairing is :func:`~arrowlake.table.changelogs.files.labelled_change`, which the ``lookup``
producer of such tables writes at write time instead (the stream then reads its changelog
files). A :class:`VectorChangeSplit` covers some partitions and buckets of one snapshot (a
key's old and new rows are always in the same one) and is picklable, like every change split.
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
from arrowlake.merge import ROW_KIND
from arrowlake.scan.split import FileTask, Split
from arrowlake.streaming.splits import KIND_NAMES, ROW_KIND_FIELD, no_columns
from arrowlake.table.changelogs.files import labelled_change
from arrowlake.table.keys.lookup import rows_at


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
        labelled = labelled_change(before, after, self.key)
        kinds = labelled.column(ROW_KIND).to_numpy()
        rows = labelled.drop_columns([ROW_KIND])
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
