"""Dask: Scan.to_dask() reads what to_arrow() reads, on a cluster of separate processes."""

from __future__ import annotations

import os
import sys

import dask.dataframe as dd
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


# -- writes ---------------------------------------------------------------------------------------


def _stored(table: al.Table) -> set[str]:
    return {f.path for f in table._storage.list_files(table.location)}


def test_write_appends_every_partition_in_one_commit(sqlite_lake, dask_client):
    source = fill_append_table(sqlite_lake)
    copy = sqlite_lake.create_table("shop.copy", source.schema, partition_by=["day"])
    ddf = source.scan(filter="y < 60").to_dask(split_bytes=1)
    assert ddf.npartitions > 1
    result = al.dask.write(ddf, copy, mode="append")
    assert copy.snapshots().num_rows == 1 and result.snapshot_id == copy.current_snapshot_id
    expected = source.scan(filter="y < 60").to_arrow()
    assert result.added_rows == expected.num_rows
    assert copy.to_arrow().sort_by("id").equals(expected.sort_by("id"))


def test_write_upserts_by_key_in_one_commit(sqlite_lake, dask_client):
    keyed = fill_pk_table(sqlite_lake)
    before = keyed.to_arrow()
    def writes() -> int:  # snapshots that are not compactions (deletion vectors compact inline)
        return keyed.snapshots().filter(pa.compute.not_equal(keyed.snapshots()["kind"],
                                                             "compact")).num_rows

    snapshots = writes()
    changes = pd.DataFrame({"id": range(1000, 1600), "y": -7})
    # Dates as Arrow dates: Dask would turn pandas' datetime.date objects into strings.
    changes = changes.merge(al.dask.to_pandas(before).drop(columns=["y"]), on="id", how="left")
    changes["x"] = changes["x"].fillna(0.0)

    ddf = dd.from_pandas(changes[list(keyed.schema.names)], npartitions=3)
    al.dask.write(ddf, keyed, mode="upsert")
    assert writes() == snapshots + 1
    after = keyed.to_arrow().to_pandas().set_index("id").sort_index()
    assert after.index.is_unique
    assert set(after.loc[1000:1599, "y"]) == {-7}  # deleted keys 1500..1549 are back
    untouched = before.to_pandas().set_index("id").sort_index()
    untouched = untouched[untouched.index < 1000]
    pd.testing.assert_frame_equal(after.loc[untouched.index], untouched)


@pytest.mark.parametrize("how", ["bad rows", "partition raises"])
def test_a_failing_partition_leaves_the_table_unchanged(sqlite_lake, dask_client, how):
    source = fill_append_table(sqlite_lake)
    target = sqlite_lake.create_table("shop.target", source.schema, partition_by=["day"])
    target.append(source.scan(filter="id < 10").to_arrow())
    rows, snapshots, files = target.to_arrow(), target.snapshots().num_rows, _stored(target)
    ddf = source.scan().to_dask(split_bytes=1)
    assert ddf.npartitions > 2

    def spoil(df: pd.DataFrame) -> pd.DataFrame:
        if (df["id"] == 1000).any():  # one partition fails after the others wrote files
            if how == "partition raises":
                raise RuntimeError("partition 1000 broke")
            df = df.assign(y=df["y"].astype(str) + "!")  # cannot become int32
        return df

    spoiled = ddf.map_partitions(spoil, meta=ddf._meta)
    error = RuntimeError if how == "partition raises" else al.ArrowlakeError
    with pytest.raises((error, ValueError, TypeError)):
        al.dask.write(spoiled, target, mode="append")
    assert target.snapshots().num_rows == snapshots
    assert target.to_arrow().sort_by("id").equals(rows.sort_by("id"))
    assert _stored(target) == files  # the other partitions' files were deleted


def test_write_refuses_upsert_without_a_key_before_writing(sqlite_lake):
    source = fill_append_table(sqlite_lake, commits=1)
    with pytest.raises(al.ValidationError, match="primary key"):
        al.dask.write(source.scan().to_dask(), source, mode="upsert")
    with pytest.raises(al.ValidationError, match="Unknown write mode"):
        al.dask.write(source.scan().to_dask(), source, mode="merge")


def test_write_on_a_local_scheduler_later_partitions_win_repeated_keys(sqlite_lake):
    import dask

    keyed = sqlite_lake.create_table("shop.keyed", pa.schema([
        pa.field("id", pa.int64(), nullable=False), ("v", pa.string())]),
        primary_key=["id"], buckets=2)
    frame = pd.DataFrame({"id": [1, 2, 3, 1, 2, 4], "v": ["a1", "a2", "a3", "b1", "b2", "b4"]})
    ddf = dd.from_pandas(frame, npartitions=2, sort=False)  # rows 0-2, then rows 3-5
    with dask.config.set(scheduler="threads"):
        al.dask.write(ddf, keyed, mode="upsert")
    assert keyed.snapshots().num_rows == 1
    assert keyed.to_arrow().sort_by("id").to_pydict() == {
        "id": [1, 2, 3, 4], "v": ["b1", "b2", "a3", "b4"]}
