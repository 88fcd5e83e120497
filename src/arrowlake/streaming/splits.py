"""The splits a change is made of, each picklable and readable in any process.

A :class:`ChangeSplit` wraps an ordinary scan :class:`~arrowlake.scan.split.Split` (read by the
same reader, merged on read where the split says so) and labels its rows with their row kind: a
constant kind for the whole split (``+I`` for added files of append tables and for full scans,
``-D`` for removed rows), or the kind stored per row in primary-key runs. Other kinds of split
(catch-up's net changes, deletion-vector tables' changes) live in modules of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import DataFileError
from arrowlake.expressions import AlwaysTrue, Expr, evaluate
from arrowlake.merge import RowKind
from arrowlake.merge.runs import KIND_COLUMN
from arrowlake.merge.versions import is_retraction
from arrowlake.scan.split import Split

#: The column a stream adds with ``include_row_kind=True``.
ROW_KIND_COLUMN = "_row_kind"
ROW_KIND_FIELD = pa.field(ROW_KIND_COLUMN, pa.string(), nullable=False)
#: Stored row-kind codes to names; code 4 (``RESTART``, an internal addition that hides every
#: older version of its key) is shown as the addition it is.
KIND_NAMES = pa.array(["+I", "-U", "+U", "-D", "+I"], pa.string())


@dataclass(frozen=True)
class ChangeSplit:
    """A part of a change, readable on its own in any process (like ``Scan.plan()`` splits).

    ``row_kind`` is the kind of every row, or None when the split reads primary-key runs as
    written: then the stored row-kind column gives each row's kind.
    """

    split: Split
    row_kind: str | None
    include_row_kind: bool
    columns: tuple[str, ...]

    @property
    def row_count(self) -> int:
        """Rows in the files before filtering (an upper bound for what the split yields)."""
        return self.split.row_count

    def output_schema(self) -> pa.Schema:
        schema = pa.schema([self.split.schema.field(c) for c in self.columns])
        return schema.append(ROW_KIND_FIELD) if self.include_row_kind else schema

    def _label(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        arrays = [batch.column(c) for c in self.columns]
        if self.include_row_kind:
            if self.row_kind is None:
                codes = batch.column(KIND_COLUMN)
                arrays.append(pc.take(KIND_NAMES, codes))
            else:
                arrays.append(_constant(self.row_kind, batch.num_rows))
        if not arrays:  # columns=[]: the rows, with no columns
            return batch.select([]).replace_schema_metadata(None)
        return pa.RecordBatch.from_arrays(arrays, schema=self.output_schema())

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        for batch in self.split.to_batches():
            yield self._label(batch)

    def to_arrow(self) -> pa.Table:
        table = self.split.to_arrow()
        schema = self.output_schema()
        return pa.Table.from_batches([self._label(b) for b in table.to_batches()], schema)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.output_schema(), self.to_batches())
        return reader.__arrow_c_stream__(requested_schema)


@dataclass(frozen=True)
class ReferencedChangeSplit:
    """The lookup changelog in format 2 of one partition and bucket of a snapshot (see
    ``arrowlake.table.changelogs.files.AFTER_COLUMN``): its changelog files, if any, and the
    runs the snapshot added there, whose rows the changelog refers to by position instead of
    copying.

    Rows come out as the changelog lists them, each ``-U`` directly followed by its ``+U``
    (the run row it refers to), markers of unchanged rows dropped, then every other addition of
    the runs as ``+I``; ``filter`` is applied to the whole rows.
    """

    log: Split | None  # columns: ``needed`` + KIND_COLUMN + ``after_column``, the log schema
    runs: Split  # columns: ``needed`` + KIND_COLUMN, the runs in key order
    needed: tuple[str, ...]  # ``columns`` and the filter's columns
    after_column: str
    unchanged: int  # the row-kind code of a marker of a new row that changed nothing
    filter: Expr
    include_row_kind: bool
    columns: tuple[str, ...]
    schema: pa.Schema  # the stream's table schema (nullability as declared)

    @property
    def row_count(self) -> int:
        """Rows of the changelog and run files (an upper bound of the rows it yields)."""
        return self.runs.row_count + (self.log.row_count if self.log is not None else 0)

    def output_schema(self) -> pa.Schema:
        schema = pa.schema([self.schema.field(c) for c in self.columns])
        return schema.append(ROW_KIND_FIELD) if self.include_row_kind else schema

    def to_arrow(self) -> pa.Table:
        runs = self.runs.to_arrow()
        r = runs.num_rows
        run_values = runs.select(list(self.needed))
        referred = np.zeros(r, dtype=bool)
        if self.log is not None:
            log = self.log.to_arrow()
            n = log.num_rows
            codes = log.column(KIND_COLUMN).to_numpy()
            at = log.column(self.after_column)
            refers = at.is_valid().to_numpy(zero_copy_only=False)
            at = pc.fill_null(at, 0).to_numpy().astype(np.int64)
            if refers.any() and int(at[refers].max()) >= r:
                raise DataFileError(
                    f"Changelog file(s) {[f.path for f in self.log.files]} of table "
                    f"{self.log.table!r} refer to rows of the runs their snapshot added, but "
                    f"those runs hold {r} rows: a data file was changed or removed; read the "
                    "stream from a later snapshot")
            referred[at[refers]] = True
            # Each changelog row but a marker yields itself; a -U referring to a run row is
            # followed by that row as +U.
            shown = codes != self.unchanged
            pair = shown & refers & (codes == int(RowKind.UPDATE_BEFORE))
            counts = shown.astype(np.int64) + pair
            starts = np.cumsum(counts) - counts
            index = np.empty(int(counts.sum()), dtype=np.int64)
            kinds = np.empty(len(index), dtype=np.int8)
            index[starts[shown]] = np.flatnonzero(shown)
            kinds[starts[shown]] = codes[shown]
            index[starts[pair] + 1] = n + at[pair]
            kinds[starts[pair] + 1] = int(RowKind.UPDATE_AFTER)
            values = pa.concat_tables([log.select(list(self.needed)),
                                       run_values.cast(log.select(list(self.needed)).schema)])
        else:
            n, index, kinds = 0, np.zeros(0, np.int64), np.zeros(0, np.int8)
            values = run_values
        inserted = np.flatnonzero(~referred & ~is_retraction(
            runs.column(KIND_COLUMN).to_numpy()))
        index = np.concatenate([index, n + inserted])
        kinds = np.concatenate([kinds, np.full(len(inserted), int(RowKind.INSERT), np.int8)])
        # (A table of no columns keeps no rows through take: count them by the index.)
        out = values.take(pa.array(index)) if self.needed else no_columns(len(index))
        if not isinstance(self.filter, AlwaysTrue):
            keep = pc.fill_null(evaluate(self.filter, out), False)
            out, kinds = out.filter(keep), kinds[keep.to_numpy(zero_copy_only=False)]
        arrays = [out.column(c) for c in self.columns]
        if self.include_row_kind:
            arrays.append(pc.take(KIND_NAMES, pa.array(kinds)))
        if not arrays:
            return no_columns(len(kinds))
        return pa.Table.from_arrays(arrays, schema=self.output_schema())

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        yield from self.to_arrow().to_batches()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_arrow().__arrow_c_stream__(requested_schema)


#: What a change is made of: plain change splits, lookup changelogs that refer to their runs,
#: or net-change splits when catching up.


def no_columns(rows: int) -> pa.Table:
    """A table of ``rows`` rows and no columns (what ``columns=[]`` reads)."""
    return pa.table({"rows": pa.nulls(rows)}).select([])


def _constant(kind: str, length: int) -> pa.Array:
    return pa.repeat(pa.scalar(kind, pa.string()), length)
