"""Splits: the picklable boundary between planning a scan and reading it.

A :class:`Split` names the files to read, the schemas they were written in, the schema to read
them as, the projection and the filter. Any process that can reach the storage reads it with
:meth:`Split.to_batches` — no metastore access needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrowlake.expressions import AlwaysTrue, Expr
from arrowlake.io.deletion_vectors import VectorRef
from arrowlake.io.storage import Storage
from arrowlake.lazy import lazy_module
from arrowlake.merge.read import MergeSpec

# The reader is bound on first use: it takes splits (and imports this module for their types),
# while a split only offers reading itself as a convenience.
_reader = lazy_module("arrowlake.scan.read")


@dataclass(frozen=True)
class FileTask:
    """One data file of a split."""

    file_id: int
    path: str  # absolute location
    file_size: int
    row_count: int
    schema_id: int
    bucket: int | None = None
    seq_min: int | None = None
    seq_max: int | None = None
    partition_id: int | None = None
    # Primary-key runs: the key range as comparable tuples (None when the key's types do not
    # compare in Python like in Arrow), and whether the run holds only additions (+I/+U).
    key_range: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None
    additions_only: bool = False
    partition_values: str | None = None  # JSON list, in the order of Split.partition_by
    # Merge-on-write primary-key tables: the rows of this file later writes replaced or
    # deleted (None: every row is live).
    deletes: VectorRef | None = None

    @property
    def live_rows(self) -> int:
        return self.row_count - (self.deletes.cardinality if self.deletes else 0)


@dataclass(frozen=True, eq=False)
class Split:
    """A self-contained unit of reading: files, schemas, projection, filter, limit."""

    storage: Storage
    files: tuple[FileTask, ...]
    file_schemas: Mapping[int, pa.Schema]
    schema: pa.Schema  # the table schema the files are read as (with field ids)
    columns: tuple[str, ...]  # output columns, in order
    filter: Expr = field(default_factory=AlwaysTrue)
    limit: int | None = None
    merge: MergeSpec | None = None
    batch_size: int = 131_072
    # The table's partition columns: readers fill them from FileTask.partition_values instead
    # of decoding them from the files (one value per file).
    partition_by: tuple[str, ...] = ()
    table: str = ""  # the table's name, for errors about its files

    @property
    def row_count(self) -> int:
        """Rows in the files before filtering (an upper bound for what the split yields)."""
        return sum(f.row_count for f in self.files)

    @property
    def size_bytes(self) -> int:
        return sum(f.file_size for f in self.files)

    def output_schema(self) -> pa.Schema:
        return pa.schema([self.schema.field(c) for c in self.columns])

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        return _reader.read_split(self)

    def to_arrow(self) -> pa.Table:
        return _reader.read_split_table(self)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.output_schema(), self.to_batches())
        return reader.__arrow_c_stream__(requested_schema)
