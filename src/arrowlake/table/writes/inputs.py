"""Turning whatever a user hands to a write into a stream of record batches."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ValidationError
from arrowlake.expressions import Expr, evaluate
from arrowlake.pandas_arrow import pandas_to_arrow
from arrowlake.schema import conform

#: pandas DataFrames are converted this many rows at a time, so a write never holds a second
#: full copy of a large frame.
PANDAS_CHUNK_ROWS = 1_000_000


def _is_pandas(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "iloc")


def batch_stream(data: Any) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema and batches of ``data``, without materializing streams.

    Accepts a ``pa.Table``, ``pa.RecordBatch``, ``pa.RecordBatchReader``, a pandas DataFrame,
    anything exposing ``__arrow_c_stream__`` or ``__arrow_c_array__`` (Polars, DuckDB, nanoarrow,
    ...), a dict of columns, or an iterable of record batches.
    """
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    if _is_pandas(data):
        first = pandas_to_arrow(data.iloc[:PANDAS_CHUNK_ROWS])

        def frames() -> Iterator[pa.RecordBatch]:
            yield from first.to_batches()
            for start in range(PANDAS_CHUNK_ROWS, len(data), PANDAS_CHUNK_ROWS):
                chunk = pandas_to_arrow(data.iloc[start:start + PANDAS_CHUNK_ROWS])
                yield from chunk.cast(first.schema).to_batches()

        return first.schema, frames()
    if hasattr(data, "__arrow_c_stream__"):
        reader = pa.RecordBatchReader.from_stream(data)
        return reader.schema, iter(reader)
    if hasattr(data, "__arrow_c_array__"):
        batch = pa.record_batch(data)
        return batch.schema, iter([batch])
    if isinstance(data, dict):
        table = pa.table(data)
        return table.schema, iter(table.to_batches())
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        items = iter(data)
        first_item = next(items, None)
        if isinstance(first_item, pa.RecordBatch):
            def chained() -> Iterator[pa.RecordBatch]:
                yield first_item
                for item in items:
                    if not isinstance(item, pa.RecordBatch):
                        raise ValidationError(
                            f"Expected only record batches in the iterable, got {type(item)}")
                    yield item

            return first_item.schema, chained()
    raise ValidationError(
        f"Cannot write data of type {type(data).__name__}: pass a pyarrow Table, RecordBatch or "
        "RecordBatchReader, a pandas DataFrame, an object with __arrow_c_stream__, a dict of "
        "columns, or an iterable of record batches"
    )


def conformed(data: Any, schema: pa.Schema, *, check: Expr | None = None,
              where: str = "input") -> Iterator[pa.RecordBatch]:
    """``data`` as batches in the table schema; with ``check``, every row must match it."""
    _, batches = batch_stream(data)
    for n, batch in enumerate(batches):
        batch = conform(batch, schema, where=f"{where} (batch {n})")
        if check is not None and batch.num_rows:
            ok = evaluate(check, batch)
            bad = batch.num_rows - int(pc.sum(ok).as_py() or 0)
            if bad:
                raise ValidationError(
                    f"{bad} rows of batch {n} do not match the overwrite filter {check}: an "
                    "overwrite with a filter may only write rows the filter selects")
        yield batch
