"""The immutable :class:`Scan`: a snapshot, a filter and a projection, read in many ways."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ValidationError, require
from arrowlake.expressions import AlwaysTrue, Expr, and_all, to_arrow, to_expression
from arrowlake.pandas_arrow import arrow_to_pandas
from arrowlake.scan.adapters import adapter
from arrowlake.scan.duckdb_relation import duckdb_relation
from arrowlake.scan.planning import (
    TableView,
    file_tasks,
    fully_matching,
    make_splits,
    plan_files,
)
from arrowlake.scan.read import count_split, read_split, read_split_table
from arrowlake.scan.split import MergeSpec, Split
from arrowlake.schema import find_field

if TYPE_CHECKING:
    import pandas as pd

#: Splits are packed up to this many bytes of files, unless the table sets ``read.split-size``.
DEFAULT_SPLIT_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class Scan:
    """A read of one table at one snapshot; ``filter``/``select`` return new scans.

    >>> scan = table.scan(filter="amount > 10", columns=["order_id"])  # doctest: +SKIP
    >>> scan.to_arrow()  # doctest: +SKIP
    """

    view: TableView
    expr: Expr
    columns: tuple[str, ...]
    limit: int | None = None
    merge: MergeSpec | None = None

    @classmethod
    def create(cls, view: TableView, filter: Expr | str | None, columns: Sequence[str] | None,
               limit: int | None, merge: MergeSpec | None) -> Scan:
        expr = to_expression(filter)
        if not isinstance(expr, AlwaysTrue):
            to_arrow(expr, view.schema)  # validates columns and literals now, not at read time
        cols = tuple(view.schema.names) if columns is None else tuple(columns)
        for c in cols:
            find_field(view.schema, c)
        if len(set(cols)) != len(cols):
            raise ValidationError(f"Columns are repeated in the projection: {list(cols)}")
        if limit is not None and limit < 0:
            raise ValidationError(f"limit must be >= 0, got {limit}")
        return cls(view, expr, cols, limit, merge)

    # -- building ------------------------------------------------------------------------------

    @property
    def snapshot_id(self) -> int | None:
        return self.view.snapshot_id

    @property
    def schema(self) -> pa.Schema:
        """The schema of what this scan returns."""
        return pa.schema([self.view.schema.field(c) for c in self.columns])

    def filter(self, filter: Expr | str) -> Scan:
        """A new scan whose filter is this one's AND ``filter``."""
        return Scan.create(self.view, and_all([self.expr, filter]), self.columns, self.limit,
                           self.merge)

    def select(self, *columns: str | Sequence[str]) -> Scan:
        """A new scan returning only ``columns``."""
        names: list[str] = []
        for c in columns:
            names.extend([c] if isinstance(c, str) else c)
        return Scan.create(self.view, self.expr, names, self.limit, self.merge)

    def with_limit(self, limit: int | None) -> Scan:
        return Scan.create(self.view, self.expr, self.columns, limit, self.merge)

    # -- planning ------------------------------------------------------------------------------

    def _files(self) -> pa.Table:
        return plan_files(self.view, self.expr)

    def plan(self, target_bytes: int | None = None, min_splits: int = 1) -> list[Split]:
        """Picklable splits, each readable on its own in any process.

        Without an explicit ``target_bytes``, splits are made smaller when the table's split
        size would give fewer than ``min_splits`` (an engine with that many workers would
        leave some idle); the files are listed once either way.
        """
        explicit = target_bytes is not None
        if target_bytes is None:
            target_bytes = int(self.view.record.properties.get("read.split-size",
                                                               DEFAULT_SPLIT_BYTES))
        tasks = file_tasks(self.view, self._files())
        splits = make_splits(self.view, tasks, columns=self.columns, expr=self.expr,
                             target_bytes=target_bytes, merge=self.merge, limit=self.limit)
        if not explicit and 0 < len(splits) < min_splits:
            total = sum(s.size_bytes for s in splits)
            splits = make_splits(self.view, tasks, columns=self.columns, expr=self.expr,
                                 target_bytes=max(1, total // min_splits), merge=self.merge,
                                 limit=self.limit)
        return splits

    def _single_split(self) -> Split | None:
        splits = self.plan(target_bytes=1 << 62)
        return splits[0] if splits else None

    # -- reading -------------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        """Every matching row as one Arrow table (files are read concurrently)."""
        split = self._single_split()
        if split is None:
            return self.schema.empty_table()
        return read_split_table(split)

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """Matching rows as a stream of record batches, reading one split at a time."""
        remaining = self.limit
        for split in self.plan():
            if remaining is not None:
                split = replace(split, limit=remaining)
            for batch in read_split(split):
                if remaining is not None:
                    remaining -= batch.num_rows
                yield batch
            if remaining is not None and remaining <= 0:
                return

    def to_reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, self.to_batches())

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def to_pandas(self, **kwargs: Any) -> pd.DataFrame:
        """The matching rows as a pandas DataFrame, with the dtypes they were written from."""
        return arrow_to_pandas(self.to_arrow(), **kwargs)

    def to_polars(self) -> Any:
        pl = require("polars", "polars", "Scan.to_polars()")
        return pl.from_arrow(self.to_arrow())

    def to_duckdb(self, connection: Any = None, name: str | None = None) -> Any:
        """A lazy DuckDB relation over the scan's rows (a view ``name`` when given).

        DuckDB reads the table's Parquet files itself when the relation is run; the relation
        holds the rows :meth:`to_arrow` returns. See :mod:`arrowlake.scan.duckdb_relation`
        for what is read through arrowlake's reader instead.
        """
        duckdb = require("duckdb", "duckdb", "Scan.to_duckdb()")
        con = connection if connection is not None else duckdb.connect()
        relation = duckdb_relation(con, self._single_split(), self.schema)
        if name is not None:
            return relation.create_view(name, replace=True)
        return relation

    def to_dask(self, *, split_bytes: int | None = None) -> Any:
        """A Dask DataFrame with one partition per split (the ``dask`` extra).

        The filter and projection are pushed into every split, primary-key tables are merged
        inside each split, and Dask's own column projection narrows what splits read.
        ``split_bytes`` overrides the table's ``read.split-size``. See :mod:`arrowlake.dask`.
        """
        return adapter("dask.read")(self, split_bytes=split_bytes)

    def to_torch(self, *, batch_size: int = 1024, shuffle_buffer: int = 0, seed: int | None = None,
                 shuffle: bool = True, drop_last: bool = False, output: str = "torch",
                 rank: int | None = None, world_size: int | None = None,
                 split_bytes: int | None = None) -> Any:
        """A PyTorch ``IterableDataset`` over the scan's splits (the ``torch`` extra).

        Every DataLoader worker of every distributed rank reads a disjoint share of the splits;
        see :func:`arrowlake.torch.dataset` for the options.
        """
        return adapter("torch.scan")(
            self, batch_size=batch_size, shuffle_buffer=shuffle_buffer, seed=seed,
            shuffle=shuffle, drop_last=drop_last, output=output, rank=rank,
            world_size=world_size, split_bytes=split_bytes)

    def count(self) -> int:
        """The number of matching rows, from metadata where statistics decide it."""
        if self.merge is not None:
            n = sum(count_split(s) for s in self.plan())
            return n if self.limit is None else min(n, self.limit)
        files = self._files()
        if files.num_rows == 0:
            return 0
        live = files.column("row_count")
        if self.view.record.deletion_vectors:
            # Rows of a file minus the positions its vector deletes: still metadata only.
            vectors = self.view.metastore.live_vectors(
                self.view.record.table_id, self.view.snapshot_id,
                files.column("file_id").to_pylist())
            deleted = pa.array([vectors[f].cardinality if f in vectors else 0
                                for f in files.column("file_id").to_pylist()], pa.int64())
            live = pc.subtract(live, deleted)
        if isinstance(self.expr, AlwaysTrue):
            n = int(pc.sum(live).as_py())
        else:
            full = fully_matching(self.view, files, self.expr)
            full = pc.fill_null(full, False)
            n = int(pc.sum(pc.filter(live, full)).as_py() or 0)
            rest = files.filter(pc.invert(full))
            if rest.num_rows:
                tasks = file_tasks(self.view, rest)
                for split in make_splits(self.view, tasks, columns=(), expr=self.expr,
                                         target_bytes=1 << 62):
                    n += count_split(split)
        return n if self.limit is None else min(n, self.limit)

    def files(self) -> pa.Table:
        """The files this scan would read, after pruning."""
        return self._files()
