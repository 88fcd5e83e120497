"""What a stream yields: a :class:`Change` of one snapshot (or of a range, when catching up),
made of picklable splits (:mod:`arrowlake.streaming.splits`, :mod:`~arrowlake.streaming.catchup`,
:mod:`~arrowlake.streaming.vector_changes`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from arrowlake.streaming.catchup import NetChangeSplit
from arrowlake.streaming.splits import ChangeSplit, ReferencedChangeSplit, no_columns
from arrowlake.streaming.vector_changes import VectorChangeSplit

if TYPE_CHECKING:
    import pandas as pd

#: Any split a change may hold.
AnySplit = ChangeSplit | ReferencedChangeSplit | NetChangeSplit | VectorChangeSplit


@dataclass(frozen=True)
class Change:
    """The rows one snapshot changed (or, when catching up, a range of snapshots changed).

    ``snapshot_id`` is the snapshot to pass to ``stream.commit`` once processed;
    ``first_snapshot_id`` equals it except for catch-up changes, which cover
    ``first_snapshot_id .. snapshot_id``. ``kind`` is the snapshot's kind (``append``,
    ``upsert``, ``delete``, ...), ``full`` for the full scan that ``start="full"`` begins with,
    and ``catch-up`` for a catch-up change. ``transaction_id`` tells which changes of several
    tables one lake transaction committed together.
    """

    snapshot_id: int
    kind: str
    committed_at: datetime
    splits: tuple[AnySplit, ...]
    schema: pa.Schema
    first_snapshot_id: int
    # The rows, when the stream read them ahead while the previous change was processed.
    prefetched: pa.Table | None = field(default=None, compare=False, repr=False)
    #: The lake transaction whose commit made the snapshot (with snapshots of other tables
    #: carrying the same id), or None for a write committed alone and for catch-up changes.
    transaction_id: str | None = None

    @property
    def row_count(self) -> int:
        """Rows in the change's files before filtering (an upper bound of its rows)."""
        return sum(split.row_count for split in self.splits)

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        if self.prefetched is not None:
            yield from self.prefetched.to_batches()
            return
        for split in self.splits:
            yield from split.to_batches()

    def to_arrow(self) -> pa.Table:
        if self.prefetched is not None:
            return self.prefetched
        tables = [split.to_arrow() for split in self.splits]
        if not tables:
            return self.schema.empty_table()
        if not self.schema.names:  # concatenating tables of no columns would lose the rows
            return no_columns(sum(t.num_rows for t in tables))
        return pa.concat_tables(tables)

    def to_pandas(self, **kwargs: Any) -> pd.DataFrame:
        return self.to_arrow().to_pandas(**kwargs)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.schema, self.to_batches())
        return reader.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        span = (f"{self.first_snapshot_id}..{self.snapshot_id}"
                if self.first_snapshot_id != self.snapshot_id else str(self.snapshot_id))
        return f"<arrowlake.Change snapshot={span} kind={self.kind} splits={len(self.splits)}>"
