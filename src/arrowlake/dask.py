"""Dask: read scans as Dask DataFrames (``Scan.to_dask()``) and write them to tables.

    ddf = orders.scan(filter="day >= '2026-11-01'", columns=["customer", "amount"]).to_dask()
    arrowlake.dask.write(ddf, lake.table("shop.orders_copy"), mode="append")

One Dask partition is one split of the scan (:meth:`Scan.plan`): the filter and projection
are pushed into every split, primary-key buckets are merged inside their split, and splits are
picklable, so partitions are read on whichever worker runs them (threads, processes or a
``distributed`` cluster). Dask's own column projection narrows what each split reads.

:func:`write` is the two-phase write of :mod:`arrowlake.table.staged`: every partition's files
are written where the partition is (in parallel), then this process commits them all in one
snapshot. If any partition fails, nothing is committed and the files the others wrote are
deleted.

``dask`` is imported only when one of these functions runs (the ``dask`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from arrowlake.errors import ValidationError, require
from arrowlake.pandas_arrow import arrow_to_pandas
from arrowlake.scan.adapters import register_adapter
from arrowlake.scan.scan import Scan
from arrowlake.scan.split import Split
from arrowlake.table import staged
from arrowlake.table.table import Table
from arrowlake.table.writes.plain import WriteResult

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["WRITE_MODES", "read", "read_split", "to_pandas", "write"]

#: ``append`` adds rows (on a primary-key table: an upsert); ``upsert`` needs a primary key.
WRITE_MODES = ("append", "upsert")


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


def stage_partition(target: staged.WriteTarget, df: pd.DataFrame, mode: staged.WriteMode,
                    order: int) -> staged.StagedWrite | BaseException:
    """Write one partition's files (on a worker); an error is returned, not raised, so the
    committing process learns about every partition and can delete what the others wrote."""
    try:
        data = pa.Table.from_pandas(df, preserve_index=False)  # Dask's index is not a column
        return staged.stage(target, data, mode, order=order)
    except Exception as exc:
        return exc


def write(ddf: Any, table: Table, mode: str = "append", *, commit_id: str | None = None
          ) -> WriteResult:
    """Write a Dask DataFrame to ``table`` in one commit: ``mode="append"`` or ``"upsert"``.

    Partitions are written in parallel on the current scheduler (a ``distributed`` cluster
    when a client is active); later partitions win where an upsert repeats a key. If one
    partition fails, its error is raised, nothing is committed, and the other partitions'
    files are deleted. ``commit_id`` makes the write idempotent, as for :meth:`Table.append`.
    """
    _dask_dataframe("arrowlake.dask.write()")
    dask = require("dask", "dask", "arrowlake.dask.write()")
    if mode not in WRITE_MODES:
        raise ValidationError(f"Unknown write mode {mode!r}; use one of {', '.join(WRITE_MODES)}")
    table._check_write(commit_id)
    target = staged.write_target(table.state, "dask")  # registered while the workers write
    try:
        staged.check_mode(target, mode, None)
        write_mode: staged.WriteMode = "upsert" if mode == "upsert" else "append"
        tasks = [dask.delayed(stage_partition, pure=False)(target, part, write_mode, n)
                 for n, part in enumerate(ddf.to_delayed())]
        outcomes = _run_all(tasks)
        done = [o for o in outcomes if isinstance(o, staged.StagedWrite)]
        failed = [o for o in outcomes if not isinstance(o, staged.StagedWrite)]
        if failed:
            staged.discard_staged(target, done)
            raise failed[0]
        return staged.commit_staged(table.state, done, write_mode, commit_id=commit_id)
    finally:
        target.finish()


def _run_all(tasks: list[Any]) -> list[Any]:
    """Every task's result or error. On a ``distributed`` cluster every task runs to its end
    even when one fails (its partition could not be computed, say), so the files of the
    others are known and deleted; local schedulers stop at the first such error, leaving files
    of finished partitions to ``remove_orphan_files``."""
    dask = require("dask", "dask", "arrowlake.dask.write()")
    client = None
    try:
        distributed = require("distributed", "dask", "arrowlake.dask.write()")
        client = distributed.default_client()
    except (ImportError, ValueError):  # no distributed, or no client: a local scheduler
        pass
    if client is None or dask.config.get("scheduler", None) not in (None, "dask.distributed"):
        return list(dask.compute(*tasks))
    futures = client.compute(tasks)
    distributed.wait(futures)
    outcomes: list[Any] = []
    for future in futures:
        if future.status == "finished":
            outcomes.append(future.result())
        else:
            outcomes.append(future.exception())
    return outcomes


register_adapter("dask.read", read)
