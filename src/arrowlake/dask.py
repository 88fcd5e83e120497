"""Dask: read scans as Dask DataFrames (``Scan.to_dask()``) and write them to tables.

    ddf = orders.scan(filter="day >= '2026-11-01'", columns=["customer", "amount"]).to_dask()

One Dask partition is one split of the scan (:meth:`Scan.plan`): the filter and projection
are pushed into every split, primary-key buckets are merged inside their split, and splits are
picklable, so partitions are read on whichever worker runs them (threads, processes or a
``distributed`` cluster). Dask's own column projection narrows what each split reads.

``dask`` is imported only when one of these functions runs (the ``dask`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from arrowlake.errors import require
from arrowlake.pandas_arrow import arrow_to_pandas
from arrowlake.scan.adapters import register_adapter
from arrowlake.scan.scan import Scan
from arrowlake.scan.split import Split

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["read", "read_split", "to_pandas"]


def _dask_dataframe(feature: str) -> Any:
    require("dask", "dask", feature)
    return require("dask.dataframe", "dask", feature)


def _keeps_type(t: pa.DataType) -> bool:
    """Whether pandas has a native dtype for ``t`` (else its values would be Python objects,
    which Dask turns into strings)."""
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_dictionary(t))


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """``table`` as pandas for Dask: dates, decimals, binary, lists and structs keep their
    Arrow type (``pd.ArrowDtype``) instead of becoming objects that Dask would turn into
    strings; they write back unchanged."""
    pd = require("pandas", "dask", "Scan.to_dask()")

    def mapper(t: pa.DataType) -> Any:
        return None if _keeps_type(t) else pd.ArrowDtype(t)

    return arrow_to_pandas(table, types_mapper=mapper)


def read_split(split: Split, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """One split as a pandas DataFrame: the function Dask maps over the splits.

    Dask passes ``columns`` when a computation needs fewer of them (its column projection), so
    every split reads only those.
    """
    if columns is not None and tuple(columns) != split.columns:
        wanted = set(columns)
        split = replace(split, columns=tuple(c for c in split.columns if c in wanted))
    return to_pandas(split.to_arrow())


def read(scan: Scan, *, split_bytes: int | None = None) -> Any:
    """``scan`` as a Dask DataFrame, one partition per split (:meth:`Scan.to_dask`)."""
    dd = _dask_dataframe("Scan.to_dask()")
    meta = to_pandas(scan.schema.empty_table())
    if scan.limit is not None:
        # A limit is global: it cannot be split up front; limited scans are small.
        return dd.from_pandas(to_pandas(scan.to_arrow()), npartitions=1)
    splits = scan.plan(split_bytes)
    if not splits:
        return dd.from_pandas(meta, npartitions=1)
    return dd.from_map(read_split, splits, meta=meta, divisions=None,
                       label="arrowlake-scan", enforce_metadata=False)


register_adapter("dask.read", read)
