"""Dask: Scan.to_dask() reads what to_arrow() reads, on a cluster of separate processes."""

from __future__ import annotations

import os
import sys

import pandas as pd
import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import MissingDependency
from tests.conftest import make_lake
from tests.engines.conftest import fill_append_table, fill_pk_table


def _frame(table: pa.Table, key: str = "id") -> pd.DataFrame:
    return table.to_pandas().sort_values(key).reset_index(drop=True)


def _computed(ddf, client, key: str = "id") -> pd.DataFrame:
    df = client.compute(ddf).result()
    return df.sort_values(key).reset_index(drop=True)


def test_to_dask_equals_to_arrow_on_an_append_table(sqlite_lake, dask_client):
    table = fill_append_table(sqlite_lake)
    scan = table.scan(filter="day >= '2026-11-02' and y < 50", columns=["id", "customer", "x"])
    ddf = scan.to_dask(split_bytes=1)
    assert ddf.npartitions == len(scan.plan(1)) > 1  # one partition per split
    assert list(ddf.columns) == ["id", "customer", "x"]
    got = _computed(ddf, dask_client)
    expected = _frame(scan.to_arrow())
    assert len(got) == len(expected) > 0
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    # The partitions were read by the workers, not by this process.
    worker_pids = set(dask_client.run(os.getpid).values())
    assert len(worker_pids) == 2 and os.getpid() not in worker_pids


def test_to_dask_aggregates_like_arrow(sqlite_lake, dask_client):
    table = fill_append_table(sqlite_lake)
    scan = table.scan(filter="day >= '2026-11-02'", columns=["customer", "x"])
    sums = dask_client.compute(
        scan.to_dask(split_bytes=1).groupby("customer").x.sum()).result().sort_index()
    expected = scan.to_arrow().group_by("customer").aggregate([("x", "sum")]).to_pandas()
    expected = expected.set_index("customer")["x_sum"].sort_index()
    assert sums.to_dict() == pytest.approx(expected.to_dict())


@pytest.mark.parametrize("kind", ["sqlite", "postgres-s3"])
def test_to_dask_merges_primary_key_tables(kind, tmp_path, request, dask_client):
    # postgres-s3: the splits carry S3 storage options to the workers.
    lake = make_lake(kind, tmp_path, request)
    request.addfinalizer(lake.close)
    table = fill_pk_table(lake)
    scan = table.scan(filter="x >= 100", columns=["id", "y", "x"])
    ddf = scan.to_dask(split_bytes=1)
    assert ddf.npartitions > 1
    got = _computed(ddf, dask_client)
    expected = _frame(scan.to_arrow())
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    assert got["id"].is_unique and not got["id"].between(1500, 1549).any()
    # Dask's column projection reads fewer columns and still merges by key.
    ys = dask_client.compute(scan.to_dask(split_bytes=1)["y"].sum()).result()
    assert ys == expected["y"].sum()


def test_to_dask_of_an_empty_table_has_the_schema(sqlite_lake):
    table = sqlite_lake.create_table("shop.empty", pa.schema([("a", pa.int64()),
                                                              ("b", pa.string())]))
    ddf = table.scan().to_dask()
    assert list(ddf.columns) == ["a", "b"]
    assert len(ddf.compute(scheduler="sync")) == 0


def test_to_dask_without_dask_names_the_extra(sqlite_lake, monkeypatch):
    table = fill_append_table(sqlite_lake, commits=1)
    monkeypatch.setitem(sys.modules, "dask", None)  # as if dask were not installed
    with pytest.raises(MissingDependency, match=r"arrowlake\[dask\]"):
        table.scan().to_dask()
    assert isinstance(al.dask, type(sys))  # importing arrowlake never needs dask


def test_to_dask_keeps_dates_as_dates(sqlite_lake, dask_client):
    # pandas holds dates as Python objects, which Dask would turn into strings.
    table = fill_append_table(sqlite_lake, commits=2)
    ddf = table.scan(columns=["id", "day"]).to_dask()
    got = _computed(ddf, dask_client)
    assert str(got["day"].dtype) == "date32[day][pyarrow]"
    expected = table.scan(columns=["id", "day"]).to_arrow().sort_by("id")
    assert got["day"].tolist() == expected["day"].to_pylist()
