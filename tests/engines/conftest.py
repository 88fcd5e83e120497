"""Fixtures for the engine adapters: tables with several splits, one Dask cluster per run."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, timedelta

import numpy as np
import pyarrow as pa
import pytest

import arrowlake as al

EVENTS_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    ("x", pa.float32()),
    ("y", pa.int32()),
    ("day", pa.date32()),
    ("customer", pa.string()),
])


def events_data(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    days = [date(2026, 11, 1) + timedelta(days=int(i % 5)) for i in ids]
    return pa.table({
        "id": ids,
        "x": (ids * 0.5).astype(np.float32),
        "y": (ids % 97).astype(np.int32),
        "day": pa.array(days, pa.date32()),
        "customer": pa.array([f"c{i % 7}" for i in ids]),
    }, schema=EVENTS_SCHEMA)


def fill_append_table(lake: al.Lake, name: str = "shop.events", commits: int = 8,
                      rows: int = 250) -> al.Table:
    """An append table of about ``commits * rows`` rows (ids 0, 1, ... without gaps), one file
    per commit and day."""
    table = lake.create_table(name, EVENTS_SCHEMA, partition_by=["day"])
    start = 0
    for i in range(commits):
        table.append(events_data(start, rows + (i % 3)))
        start += rows + (i % 3)
    return table


def fill_pk_table(lake: al.Lake, name: str = "shop.orders") -> al.Table:
    """A primary-key table whose keys were upserted several times (the default mode, deletion
    vectors: reads drop the replaced rows)."""
    table = lake.create_table(name, EVENTS_SCHEMA, primary_key=["id"], buckets=4)
    for i in range(4):
        batch = events_data(i * 300, 600)
        table.upsert(batch.set_column(2, "y", pa.array(np.full(600, i, np.int32))))
    table.delete("id >= 1500 and id < 1550")
    return table


@pytest.fixture(scope="module")
def dask_client() -> Iterator[object]:
    """A local distributed cluster: 2 worker processes, separate from the test process.

    Closed after each module: while its threads run, a DataLoader test forking workers in the
    same test process hung now and then, its worker stuck on SQLite's allocator mutex (held
    at the fork by another thread; see ``_IN_SQLITE`` in ``arrowlake/metastore/signals.py``)."""
    import distributed  # the dask extra (in dev)

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=40)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()
