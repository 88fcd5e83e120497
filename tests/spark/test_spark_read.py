"""Batch reads through format("arrowlake") return what the table holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import NotFound
from tests.spark.helpers import all_types_data, as_spark_rows, frame_rows

pytest.importorskip("pyspark")

import arrowlake.spark as als

ORDERS = pa.schema([("order_id", pa.int64()), ("day", pa.string()), ("customer", pa.string()),
                    ("amount", pa.int32())])


def orders(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"order_id": ids, "day": [f"2026-11-0{1 + i % 3}" for i in ids],
                     "customer": [f"c{i % 7}" for i in ids], "amount": [i % 100 for i in ids]},
                    schema=ORDERS)


def read(spark, lake_path, name, **options):
    reader = spark.read.format("arrowlake").option("lake", str(lake_path))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(name)


@pytest.fixture
def lake_path(tmp_path):
    return tmp_path / "lake"


def test_format_works_without_registering_and_reads_an_append_table(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("shop.orders", ORDERS, partition_by=["day"])
    t.append(orders(0, 500))
    t.append(orders(500, 300))
    df = read(spark, lake_path, "shop.orders")
    als.register(spark)  # the explicit way does the same
    assert read(spark, lake_path, "shop.orders").count() == 800
    assert df.schema.simpleString() == \
        "struct<order_id:bigint,day:string,customer:string,amount:int>"
    assert frame_rows(df) == as_spark_rows(t.to_arrow())


def test_one_input_partition_per_split(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("shop.orders", ORDERS)
    for i in range(4):
        t.append(orders(i * 100, 100))
    splits = t.scan().plan(1)
    assert len(splits) == 4
    df = read(spark, lake_path, "shop.orders", splitSize="1")
    assert df.rdd.getNumPartitions() == 4
    assert read(spark, lake_path, "shop.orders", minPartitions="1").rdd.getNumPartitions() == 1
    # Without splitSize, small tables are still cut into enough partitions for the cores.
    assert read(spark, lake_path, "shop.orders", minPartitions="3").rdd.getNumPartitions() >= 3


def test_primary_key_table_reads_merged_rows(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("crm.users", ORDERS, primary_key=["order_id"], buckets=3,
                          deletion_vectors=False)
    t.upsert(orders(0, 300))
    t.upsert(orders(100, 100).set_column(3, "amount", pa.array([-1] * 100, pa.int32())))
    t.delete("order_id < 20")
    t.upsert(orders(290, 20))
    df = read(spark, lake_path, "crm.users", splitSize="1")
    assert df.rdd.getNumPartitions() == 3  # a split per bucket
    assert frame_rows(df) == as_spark_rows(t.to_arrow())
    assert df.count() == 290


def test_every_column_type_reads_as_the_table_holds_it(spark, lake_path):
    lake = al.connect(lake_path)
    data = all_types_data()
    t = lake.create_table("t.types", data.schema)
    t.append(data)
    df = read(spark, lake_path, "t.types")
    assert frame_rows(df, "id") == as_spark_rows(t.to_arrow(), "id")
    assert frame_rows(df, "id")[0]["u64"] == 2**64 - 1


def test_reads_after_schema_evolution(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("shop.orders", ORDERS)
    t.append(orders(0, 50))
    t.rename_column("customer", "client")
    t.alter_column("amount", pa.int64())
    t.add_column("note", pa.string())
    t.append(pa.table({"order_id": [1000], "day": ["x"], "client": ["z"], "amount": [2**40],
                       "note": ["new"]}))
    t.drop_column("day")
    df = read(spark, lake_path, "shop.orders")
    assert df.columns == ["order_id", "client", "amount", "note"]
    assert frame_rows(df) == as_spark_rows(t.to_arrow())


def test_time_travel_and_column_options(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("shop.orders", ORDERS)
    first = t.append(orders(0, 10)).snapshot_id
    t.create_tag("v1")
    between = datetime.now(UTC)
    t.append(orders(10, 10))
    assert read(spark, lake_path, "shop.orders", snapshot=str(first)).count() == 10
    assert read(spark, lake_path, "shop.orders", tag="v1").count() == 10
    assert read(spark, lake_path, "shop.orders", asOf=between.isoformat()).count() == 10
    df = read(spark, lake_path, "shop.orders", columns="amount, order_id")
    assert df.columns == ["amount", "order_id"]
    assert frame_rows(df, "order_id") == as_spark_rows(
        t.scan(columns=["amount", "order_id"]).to_arrow(), "order_id")
    with pytest.raises(Exception, match="TagNotFound|tag"):
        read(spark, lake_path, "shop.orders", tag="nope").count()


QUERIES = [
    "day = '2026-11-02'",
    "order_id in (7, 8, 3900) and amount > 3",
    "customer like 'c1%' or amount < 5",
    "not (customer = 'c3') and amount >= 50 and day <> '2026-11-01'",
    "amount is null or order_id between 10 and 20 or customer like '%3'",
]


def _orders_table(lake_path, table_kind: str) -> al.Table:
    """shop.orders, a primary-key or an append table, with 3,000 orders in it."""
    lake = al.connect(lake_path)
    if table_kind == "pk":
        t = lake.create_table("shop.orders", ORDERS, primary_key=["order_id", "day"],
                              partition_by=["day"], buckets=4)
    else:
        t = lake.create_table("shop.orders", ORDERS, partition_by=["day"])
    t.append(orders(0, 3000))
    return t


@pytest.mark.parametrize("table_kind", ["append", "pk"])
def test_pushdown_returns_the_same_rows_as_no_pushdown(spark, lake_path, table_kind):
    t = _orders_table(lake_path, table_kind)
    t.append(orders(2000, 2000))
    # What Spark itself selects from the same rows.
    plain = spark.createDataFrame(t.to_arrow().to_pandas(), "order_id long, day string, "
                                  "customer string, amount int")
    without = {q: frame_rows(read(spark, lake_path, "shop.orders").where(q)) for q in QUERIES}
    key = "spark.sql.python.filterPushdown.enabled"
    spark.conf.set(key, "true")
    try:
        for q in QUERIES:
            assert without[q] == frame_rows(plain.where(q)), q
            assert frame_rows(read(spark, lake_path, "shop.orders").where(q)) == without[q], q
        # The source takes no pushed filter (see arrowlake.spark.source): nothing is pruned.
        full = read(spark, lake_path, "shop.orders", splitSize="1")
        assert full.rdd.getNumPartitions() == len(t.scan().plan(1))
        by_day = read(spark, lake_path, "shop.orders", splitSize="1").where(
            "day = '2026-11-02'")
        assert by_day.rdd.getNumPartitions() == full.rdd.getNumPartitions()
    finally:
        spark.conf.set(key, "false")


@pytest.mark.parametrize("table_kind", ["append", "pk"])
def test_the_filter_option_prunes_and_holds_for_every_scan(spark, lake_path, table_kind):
    t = _orders_table(lake_path, table_kind)
    full = read(spark, lake_path, "shop.orders", splitSize="1")
    by_day = read(spark, lake_path, "shop.orders", splitSize="1", filter="day = '2026-11-02'")
    assert by_day.rdd.getNumPartitions() < full.rdd.getNumPartitions()
    assert frame_rows(by_day) == as_spark_rows(t.scan("day = '2026-11-02'").to_arrow())
    by_key = read(spark, lake_path, "shop.orders", splitSize="1",
                  filter="order_id = 42 and day = '2026-11-01'")
    if table_kind == "pk":  # the full key picks one bucket of one partition
        assert by_key.rdd.getNumPartitions() == 1
    # The filter is the DataFrame's: a self-join sees it on both sides.
    by_key.createOrReplaceTempView("by_key")
    assert spark.sql("select count(*) from by_key a join by_key b using (order_id)"
                     ).first()[0] == 1
    with pytest.raises(Exception, match="nope"):
        read(spark, lake_path, "shop.orders", filter="nope = 1")


def test_pushdown_on_a_dataframe_loaded_before_the_table_changed(spark, lake_path, pushdown):
    """A DataFrame loaded before the table changed: with pushdown on, each query plans again,
    and the rows are those of the snapshot current when the query runs."""
    lake = al.connect(lake_path)
    t = lake.create_table("shop.orders", ORDERS, partition_by=["day"])
    t.append(orders(0, 300))
    df = read(spark, lake_path, "shop.orders")
    t.add_column("note", pa.string())
    t.append(pa.table({"order_id": [5000, 5001], "day": ["2026-11-02", "2026-11-03"],
                       "customer": ["c1", "c2"], "amount": [77, 78], "note": ["a", "b"]}))
    query = "amount > 75 and day = '2026-11-02'"
    pushed = frame_rows(df.where(query))
    expected = as_spark_rows(t.scan(query, ["order_id", "day", "customer", "amount"])
                             .to_arrow())
    assert pushed == expected
    assert [r["order_id"] for r in pushed if r["order_id"] >= 5000] == [5000]
    # A schema given by the reader: the worker looks the table schema up itself.
    given = spark.read.format("arrowlake").option("lake", str(lake_path)) \
        .schema("order_id long, day string, customer string, amount int") \
        .load("shop.orders")
    assert frame_rows(given.where(query)) == expected


def test_a07_a_lake_that_does_not_exist_is_refused_and_nothing_is_created(spark, tmp_path):
    typo = tmp_path / "lakee"
    data = tmp_path / "data"  # a folder that holds other things, but no lake
    data.mkdir()
    (data / "orders.csv").write_text("a,b\n1,2\n")
    one = spark.createDataFrame([(1, "d", "c", 1)], "order_id long, day string, "
                                "customer string, amount int")
    with pytest.raises(Exception, match="No lake at"):
        read(spark, typo, "shop.orders").count()
    with pytest.raises(Exception, match="No lake at"):
        one.write.format("arrowlake").option("lake", str(data)).mode("append") \
            .save("shop.orders")
    with pytest.raises(Exception, match="No lake at"):
        spark.readStream.format("arrowlake").option("lake", str(typo)).load("shop.orders")
    for where in (typo, data, f"sqlite:///{tmp_path}/meta.db"):  # the driver's own check
        with pytest.raises(NotFound, match="No lake at"):
            als.read(spark, str(where), "shop.orders", warehouse=str(tmp_path / "wh"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert [p.name for p in data.iterdir()] == ["orders.csv"]
    # In a lake that exists, a table that does not is named as such.
    al.connect(tmp_path / "lake")
    with pytest.raises(Exception, match="TableNotFound"):
        one.write.format("arrowlake").option("lake", str(tmp_path / "lake")) \
            .mode("append").save("shop.orders")


def test_a14_an_unreadable_as_of_is_a_validation_error(spark, lake_path):
    from arrowlake.spark.source import ReadOptions

    lake = al.connect(lake_path)
    lake.create_table("shop.orders", ORDERS).append(orders(0, 10))
    for text in ("garbage", "-5", "99999999999999999999"):
        with pytest.raises(al.ValidationError, match="Invalid arrowlake read option: asOf"):
            ReadOptions.from_options({"asof": text})
    with pytest.raises(Exception, match="ValidationError: Invalid arrowlake read option: asOf"):
        read(spark, lake_path, "shop.orders", asOf="garbage").count()
