"""Queries that scan one DataFrame or view more than once return the rows Spark's own Parquet
reader returns for the same data, with Python filter pushdown on and off.

PySpark 4.3.0 keeps the read planned by ``pushFilters`` on the data source object that every
scan of a DataFrame shares, so a source that took pushed filters read another scan's rows
(issue 20, item 1). The tables have several files, so pruning would matter; the primary-key
table has overlapping runs, so ``arrowlake.spark.read`` sends merged buckets through the data
source.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from arrowlake.merge.bucketing import bucket_of

pytest.importorskip("pyspark")

import arrowlake.spark as als

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("amount", pa.int32())])
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"

#: Each scans the view several times with different filters: a view used twice in one query,
#: an IN subquery, a self-join and a correlated subquery.
QUERIES = [
    """select (select count(*) from {v} where id < 100),
              (select count(*) from {v} where id >= 3500),
              (select sum(amount) from {v} where day = 'd1'),
              (select count(*) from {v} a
               where a.day = 'd2' and a.id in (select id + 1 from {v} where amount < 10))""",
    """select (select count(*) + sum(x.amount) * 10000 + sum(y.amount)
               from {v} x join {v} y on x.id = y.id + 1000
               where x.id < 1500 and y.amount >= 50),
              (select count(*) + sum(o.amount) * 10000 from {v} o
               where o.id >= 3000 and o.amount > (select avg(i.amount) from {v} i
                                                  where i.day = o.day and i.id < 1000))""",
]


def data(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "day": [f"d{i % 3}" for i in ids],
                     "amount": [i % 100 for i in ids]}, schema=SCHEMA)


@pytest.fixture(scope="module")
def lake_path(tmp_path_factory):
    """An append table and a primary-key table of 4,000 rows each, several files each; the
    Parquet copy of each table's rows is Spark's reference."""
    root = tmp_path_factory.mktemp("multiscan")
    lake = al.connect(root / "lake")
    append = lake.create_table("s.events", SCHEMA)
    keyed = lake.create_table("s.users", SCHEMA, primary_key=["id"], buckets=2,
                              deletion_vectors=False)  # buckets to merge
    for start in range(0, 4000, 1000):
        append.append(data(start, 1000))
        keyed.upsert(data(start, 1000))
    # A run over bucket 0's keys that overlaps the first ones: bucket 0 must be merged, bucket
    # 1 is read by Spark's Parquet reader on the fast path.
    every = data(0, 4000)
    again = every.filter(pc.equal(bucket_of(every, ["id"], 2), 0))
    again = again.take(list(range(0, again.num_rows, 4)))
    keyed.upsert(again.set_column(2, "amount", pc.cast(pc.bit_wise_and(
        pc.add(again["id"], 13), 63), pa.int32())))
    gone = every.filter(pc.equal(bucket_of(every, ["id"], 2), 0))["id"].to_pylist()[-60::3]
    keyed.delete(f"id in ({', '.join(map(str, gone))})")
    for table in (append, keyed):
        folder = root / f"parquet-{table.name}"
        folder.mkdir()
        rows = table.to_arrow()
        for i, part in enumerate(rows.to_batches(max_chunksize=1000)):
            pq.write_table(pa.Table.from_batches([part]), folder / f"part-{i}.parquet")
    return root


def results(spark, frame, view: str) -> list:
    """The queries' rows over ``frame``, and the counts of one DataFrame reused across
    queries, with and without filters."""
    frame.createOrReplaceTempView(view)
    try:
        out: list = [spark.sql(q.format(v=view)).collect()[0] for q in QUERIES]
    finally:
        spark.catalog.dropTempView(view)
    return [*out, frame.where("id < 10").count(), frame.count(),
            frame.where("day = 'd0' and id >= 3990").count()]


@pytest.fixture(scope="module")
def expected(spark, lake_path):
    """What Spark's Parquet reader returns for each table."""
    return {name: results(spark, spark.read.parquet(str(lake_path / f"parquet-{name}")), "ref")
            for name in ("s.events", "s.users")}


@pytest.mark.parametrize("pushdown", ["true", "false"])
@pytest.mark.parametrize("table", ["s.events", "s.users"])
def test_item1_multi_scan_queries_match_sparks_parquet_reader(spark, lake_path, expected,
                                                               table, pushdown):
    lake = str(lake_path / "lake")
    if table == "s.users":  # merged buckets go through the data source on the fast path
        fast_plan = als.plan_read(spark, lake, table)
        assert fast_plan.source and fast_plan.parquet
    spark.conf.set(PUSHDOWN, pushdown)
    try:
        source = spark.read.format("arrowlake").option("lake", lake).load(table)
        got = {"format('arrowlake')": results(spark, source, "via_source"),
               "arrowlake.spark.read": results(spark, als.read(spark, lake, table), "via_fast")}
    finally:
        spark.conf.set(PUSHDOWN, "false")
    assert got == {"format('arrowlake')": expected[table], "arrowlake.spark.read": expected[table]}
