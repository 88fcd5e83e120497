"""Fast catch-up on primary-key tables: the net change of a range of snapshots per key.

For the keys that runs committed in ``(a, b]`` touched, the merged row at snapshot ``a``
(``before``) is compared with the merged row at snapshot ``b`` (``after``):

- present after, absent before: ``+I`` with the final row;
- present in both: ``+U`` with the final row (also when the values ended where they began);
- present before, absent after: ``-D`` with the row as it was at ``a``;
- absent in both (inserted and deleted within the range): nothing.

A :class:`NetChangeSplit` covers whole buckets, reads its three parts with the ordinary split
reader (merged on read), and is picklable like any split.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from arrowlake.expressions import AlwaysTrue, Expr, evaluate
from arrowlake.scan.split import Split
from arrowlake.streaming.change import ROW_KIND_COLUMN, ROW_KIND_FIELD

_INDEX = "__al_row"


def _member(rows: pa.Table, other: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Per row of ``rows``: whether its key occurs in ``other`` (a hash semi join on the key
    columns only, so value columns of any type never enter the join)."""
    mask = np.zeros(rows.num_rows, dtype=bool)
    if rows.num_rows == 0 or other.num_rows == 0:
        return mask
    left = rows.select(list(key)).append_column(
        _INDEX, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    hits = left.join(other.select(list(key)), keys=list(key), join_type="left semi")
    mask[hits.column(_INDEX).to_numpy()] = True
    return mask


@dataclass(frozen=True)
class NetChangeSplit:
    """The net change of some buckets over a range of snapshots (see the module docs)."""

    touched: Split  # the runs committed in the range, key columns only, read as written
    before: Split | None  # merged rows of those buckets at the range's start (None: empty)
    after: Split | None  # merged rows at its end (None: the buckets ended empty)
    key: tuple[str, ...]
    columns: tuple[str, ...]
    include_row_kind: bool
    filter: Expr

    @property
    def row_count(self) -> int:
        return self.touched.row_count

    def output_schema(self) -> pa.Schema:
        base = self.after if self.after is not None else self.before
        assert base is not None
        schema = pa.schema([base.schema.field(c) for c in self.columns])
        return schema.append(ROW_KIND_FIELD) if self.include_row_kind else schema

    def to_arrow(self) -> pa.Table:
        schema = self.output_schema()
        touched = self.touched.to_arrow().group_by(list(self.key)).aggregate([])
        before = self._restricted(self.before, touched)
        after = self._restricted(self.after, touched)
        existed = _member(after, before, self.key)
        remains = _member(before, after, self.key)
        parts = [(before.filter(pa.array(~remains)), "-D"),
                 (after.filter(pa.array(~existed)), "+I"),
                 (after.filter(pa.array(existed)), "+U")]
        out = []
        for rows, kind in parts:
            if rows.num_rows == 0:
                continue
            if not isinstance(self.filter, AlwaysTrue):
                rows = rows.filter(evaluate(self.filter, rows))
            arrays = [rows.column(c) for c in self.columns]
            if self.include_row_kind:
                arrays.append(pa.chunked_array(
                    [pa.repeat(pa.scalar(kind, pa.string()), rows.num_rows)], pa.string()))
            out.append(pa.Table.from_arrays(arrays, schema=schema))
        return pa.concat_tables(out) if out else schema.empty_table()

    def _restricted(self, split: Split | None, keys: pa.Table) -> pa.Table:
        if split is None:
            base = self.after if self.after is not None else self.before
            assert base is not None
            return pa.schema([base.schema.field(c) for c in base.columns]).empty_table()
        rows = split.to_arrow()
        return rows.filter(pa.array(_member(rows, keys, self.key)))

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        yield from self.to_arrow().to_batches()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_arrow().__arrow_c_stream__(requested_schema)


__all__ = ["ROW_KIND_COLUMN", "NetChangeSplit"]
