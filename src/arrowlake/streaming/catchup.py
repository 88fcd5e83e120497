"""Fast catch-up on primary-key tables: the net change of a range of snapshots per key.

The buckets that runs committed in ``(a, b]`` touched (known from the metastore alone) are read
merged at snapshot ``a`` (``before``) and at ``b`` (``after``); keys outside those buckets are
unchanged. Per key:

- present after, absent before: ``+I`` with the final row;
- present in both with some value changed: ``+U`` with the final row;
- present before, absent after: ``-D`` with the row as it was at ``a``;
- unchanged, or absent in both (inserted and deleted within the range): nothing.

A :class:`NetChangeSplit` covers whole buckets, reads both states with the ordinary split
reader (merged on read), and is picklable like any split.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.expressions import AlwaysTrue, Expr, evaluate
from arrowlake.merge import ROW_KIND, RowKind
from arrowlake.scan.split import Split
from arrowlake.streaming.splits import KIND_NAMES, ROW_KIND_FIELD, no_columns
from arrowlake.table.changelogs.files import diff


@dataclass(frozen=True)
class NetChangeSplit:
    """The net change of some buckets over a range of snapshots (see the module docs)."""

    before: Split | None  # merged rows of the buckets at the range's start (None: empty)
    after: Split | None  # merged rows at its end (None: the buckets ended empty)
    key: tuple[str, ...]
    columns: tuple[str, ...]
    include_row_kind: bool
    filter: Expr

    @property
    def _any(self) -> Split:
        split = self.after if self.after is not None else self.before
        assert split is not None
        return split

    @property
    def row_count(self) -> int:
        return sum(s.row_count for s in (self.before, self.after) if s is not None)

    def output_schema(self) -> pa.Schema:
        schema = pa.schema([self._any.schema.field(c) for c in self.columns])
        return schema.append(ROW_KIND_FIELD) if self.include_row_kind else schema

    def to_arrow(self) -> pa.Table:
        empty = pa.schema([self._any.schema.field(c) for c in self._any.columns]).empty_table()
        before = self.before.to_arrow() if self.before is not None else empty
        after = self.after.to_arrow() if self.after is not None else empty
        changes = diff(before, after, self.key)
        kinds = changes.column(ROW_KIND)
        changes = changes.filter(pc.not_equal(kinds, int(RowKind.UPDATE_BEFORE)))
        if not isinstance(self.filter, AlwaysTrue):
            changes = changes.filter(evaluate(self.filter, changes))
        arrays = [changes.column(c) for c in self.columns]
        if self.include_row_kind:
            arrays.append(pc.take(KIND_NAMES, changes.column(ROW_KIND)))
        if not arrays:  # columns=[]: the rows, with no columns
            return no_columns(changes.num_rows)
        return pa.Table.from_arrays(arrays, schema=self.output_schema())

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        yield from self.to_arrow().to_batches()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_arrow().__arrow_c_stream__(requested_schema)
