"""Scans: filters (expressions and strings), projection, pruning, time travel, outputs."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import arrowlake as al
from arrowlake.errors import ColumnNotFound, FilterSyntaxError, SnapshotNotFound, TagNotFound
from tests.conftest import orders_data, put_file, sorted_rows, stored_paths


@pytest.fixture
def filled(orders):
    orders.append(orders_data(0, 30))
    return orders


def expected(data: pa.Table, mask) -> list[dict]:
    return sorted_rows(data.filter(mask))


def test_filter_string_and_projection(filled):
    data = orders_data(0, 30)
    scan = filled.scan(filter="day >= '2026-11-02' and customer in ('a', 'b')",
                       columns=["order_id", "amount"])
    out = scan.to_arrow()
    assert out.column_names == ["order_id", "amount"]
    mask = pc.and_(pc.greater_equal(data["day"], pa.scalar(date(2026, 11, 2))),
                   pc.is_in(data["customer"], pa.array(["a", "b"])))
    assert sorted_rows(out) == expected(data.select(["order_id", "amount"]), mask)


def test_filter_expression_equals_string(filled):
    a = filled.scan(filter=(al.col("amount") > 10) & ~al.col("customer").isin(["c"])).to_arrow()
    b = filled.scan(filter="amount > 10 and not customer in ('c')").to_arrow()
    assert sorted_rows(a) == sorted_rows(b) and a.num_rows > 0


def test_scan_is_immutable(filled):
    base = filled.scan()
    narrowed = base.filter("amount > 20").select("order_id")
    assert base.to_arrow().num_rows == 30
    assert narrowed.to_arrow().column_names == ["order_id"]
    assert narrowed.count() == orders_data(0, 30).filter(
        pc.greater(orders_data(0, 30)["amount"], 20)).num_rows
    filled.append(orders_data(100, 5))
    assert base.count() == 30  # pinned to the snapshot it was created on
    assert filled.scan().count() == 35


def test_partition_pruning_reads_only_matching_files(filled):
    scan = filled.scan(filter=al.col("day") == date(2026, 11, 2))
    assert scan.files().num_rows == 1
    assert all(d == date(2026, 11, 2) for d in scan.to_arrow()["day"].to_pylist())


def test_statistics_pruning(lake):
    t = lake.create_table("n.stats", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    for i in range(5):
        t.append(pa.table({"id": pa.array(range(i * 100, i * 100 + 100), pa.int64()),
                           "v": [f"x{i}"] * 100}))
    scan = t.scan(filter="id between 150 and 160")
    assert scan.files().num_rows == 1
    assert scan.to_arrow()["id"].to_pylist() == list(range(150, 161))
    assert t.scan(filter="id > 10000").files().num_rows == 0
    assert t.scan(filter="v = 'x3'").files().num_rows == 1


def test_limit(filled):
    assert filled.scan(limit=7).to_arrow().num_rows == 7
    assert sum(b.num_rows for b in filled.scan(limit=7).to_batches()) == 7
    assert filled.scan(limit=7).count() == 7
    assert filled.scan(limit=0).to_arrow().num_rows == 0


def test_count_from_metadata_and_with_filters(filled):
    data = orders_data(0, 30)
    assert filled.count() == 30
    assert filled.scan(filter="day = '2026-11-01'").count() == 10
    assert filled.scan(filter="amount > 5").count() == data.filter(
        pc.greater(data["amount"], 5)).num_rows


def test_to_batches_streams(filled):
    batches = list(filled.scan().to_batches())
    assert sum(b.num_rows for b in batches) == 30
    assert all(isinstance(b, pa.RecordBatch) for b in batches)


def test_time_travel_by_id_time_and_tag(filled):
    first = filled.current_snapshot_id
    time.sleep(0.01)
    moment = datetime.now(UTC)
    time.sleep(0.01)
    filled.create_tag("before-delete")
    filled.delete("customer = 'a'")
    assert filled.scan(snapshot=first).count() == 30
    assert filled.scan(as_of=moment).count() == 30
    assert filled.scan(tag="before-delete").count() == 30
    assert filled.count() < 30
    assert filled.tags() == {"before-delete": first}
    with pytest.raises(SnapshotNotFound):
        filled.scan(snapshot=99)
    with pytest.raises(SnapshotNotFound):
        filled.scan(as_of=datetime(2000, 1, 1, tzinfo=UTC))
    with pytest.raises(TagNotFound):
        filled.scan(tag="nope")
    with pytest.raises(al.ValidationError, match="at most one"):
        filled.scan(snapshot=first, tag="before-delete")


def test_bad_filters_are_clear(filled):
    with pytest.raises(FilterSyntaxError) as info:
        filled.scan(filter="amount > ")
    assert info.value.position == 9
    with pytest.raises(FilterSyntaxError):
        filled.scan(filter="amount >> 3")
    with pytest.raises(FilterSyntaxError):
        filled.scan(filter="customer = 'unterminated")
    with pytest.raises(ColumnNotFound, match="nope"):
        filled.scan(filter="nope = 1")
    with pytest.raises(ColumnNotFound, match="nope"):
        filled.scan(columns=["nope"])
    with pytest.raises(al.ValidationError):
        filled.scan(filter="order_id = 'abc'")


def test_arrow_c_stream_consumers(filled):
    reader = pa.RecordBatchReader.from_stream(filled.scan(columns=["order_id"]))
    assert reader.read_all().num_rows == 30
    assert pa.table(filled.scan(columns=["order_id"])).num_rows == 30


def test_polars_and_duckdb_outputs(filled):
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    df = filled.scan(filter="amount > 0").to_polars()
    assert isinstance(df, pl.DataFrame) and df.height == filled.scan(filter="amount > 0").count()
    rel = filled.scan().to_duckdb()
    assert rel.aggregate("count(*)").fetchall()[0][0] == 30
    con = duckdb.connect()
    filled.scan().to_duckdb(con, name="orders")
    assert con.execute("select count(*) from orders where customer = 'a'").fetchone()[0] == 8


def test_splits_pickle_and_read_in_another_process(filled, tmp_path):
    splits = filled.scan(filter="amount > 3", columns=["order_id", "amount"]).plan(
        target_bytes=1)
    assert len(splits) == 3
    expected_rows = sorted_rows(filled.scan(filter="amount > 3",
                                            columns=["order_id", "amount"]).to_arrow())
    payload = tmp_path / "splits.pkl"
    payload.write_bytes(pickle.dumps(splits))
    out = tmp_path / "out.arrow"
    code = (
        "import pickle, sys, pyarrow as pa\n"
        f"splits = pickle.loads(open({str(payload)!r}, 'rb').read())\n"
        "t = pa.concat_tables([s.to_arrow() for s in splits])\n"
        f"with pa.OSFile({str(out)!r}, 'wb') as f:\n"
        "    w = pa.ipc.new_file(f, t.schema); w.write_table(t); w.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    got = pa.ipc.open_file(str(out)).read_all()
    assert sorted_rows(got) == expected_rows


def test_expire_snapshots_and_time_travel_limits(filled):
    filled.append(orders_data(100, 5))
    filled.delete("order_id >= 100")
    files_before = set(filled.files(snapshot=2).column("path").to_pylist())
    res = filled.expire_snapshots(retain_last=1)
    assert res.expired_snapshots == [1, 2]
    assert filled.snapshots()["snapshot_id"].to_pylist() == [3]
    assert filled.count() == 30
    present = stored_paths(filled)
    gone = [p for p in files_before if p not in present]
    assert gone and all(p not in filled.files().column("path").to_pylist() for p in gone)
    with pytest.raises(SnapshotNotFound):
        filled.scan(snapshot=1)


def test_expire_keeps_tagged_and_young_snapshots(filled):
    filled.create_tag("keep")
    filled.append(orders_data(100, 5))
    filled.append(orders_data(200, 5))
    assert filled.expire_snapshots(older_than=timedelta(hours=1)).expired_snapshots == []
    res = filled.expire_snapshots(older_than=timedelta(0))
    assert res.expired_snapshots == [2]  # 1 is tagged, 3 is current
    assert filled.scan(tag="keep").count() == 30


def test_remove_orphan_files(filled):
    stray = filled._storage.join(filled.location, "data", "stray.parquet")
    put_file(filled, stray, b"junk")
    assert filled.remove_orphan_files().files == []  # younger than a day
    found = filled.remove_orphan_files(older_than=timedelta(0))
    assert found.files == [stray] and found.dry_run and stray in stored_paths(filled)
    filled.remove_orphan_files(older_than=timedelta(0), dry_run=False)
    assert stray not in stored_paths(filled)
    assert filled.count() == 30
