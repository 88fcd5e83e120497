"""Spark Declarative Pipelines: streaming tables named by their checkpoint, what PySpark does
not hand over, and examples/pipelines run by a real ``spark-pipelines run``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.spark.pipelines import pipeline_flow
from tests.services import one_spark_pipelines_run

pyspark = pytest.importorskip("pyspark")
PYSPARK = tuple(int(part) for part in pyspark.__version__.split(".")[:2])

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipelines"


def test_pipeline_flow_from_what_spark_pipelines_sets():
    where = "file:/s/_checkpoints/spark_catalog/default/orders/orders/1"
    flow = pipeline_flow({"checkpointlocation": where,
                          "queryname": "spark_catalog.default.orders"})
    assert flow is not None and flow.table == "default.orders" and flow.is_default_flow
    extra = pipeline_flow({"checkpointlocation": where.replace("orders/1", "extra/0"),
                           "queryname": "spark_catalog.default.extra"})
    assert extra is not None and extra.table == "default.orders" and not extra.is_default_flow
    # Outside a pipeline, or naming its table, a write is left as it is.
    assert pipeline_flow({"checkpointlocation": "/ck", "queryname": "q"}) is None
    assert pipeline_flow({"checkpointlocation": where, "queryname": "other"}) is None
    assert pipeline_flow({"checkpointlocation": where, "path": "a.b",
                          "queryname": "spark_catalog.default.orders"}) is None


def test_streaming_dataset_created_then_replaced_by_a_full_refresh(spark, tmp_path):
    lake_dir = tmp_path / "lake"
    al.connect(lake_dir).close()
    src = tmp_path / "src"
    storage = tmp_path / "storage" / "_checkpoints" / "spark_catalog" / "default" / "ds"

    def run(checkpoint: int, rows: list[tuple[int, str]], n: int) -> None:
        spark.createDataFrame(rows, "id long, v string").write.mode("append").parquet(
            str(src / f"part-{n}"))
        query = (spark.readStream.schema("id long, v string").parquet(str(src / f"part-{n}"))
                 .writeStream.format("arrowlake").option("lake", str(lake_dir))
                 .queryName("spark_catalog.default.ds")
                 .option("checkpointLocation", str(storage / "ds" / str(checkpoint)))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    run(0, [(1, "a"), (2, "b")], 0)
    lake = al.connect(lake_dir)
    table = lake.table("default.ds")  # created by the writer from the flow's schema
    assert table.schema.names == ["id", "v"]
    assert sorted(table.to_pandas()["id"]) == [1, 2]
    # A full refresh starts checkpoint 1: its first batch replaces the rows, in one commit.
    before = len(table.snapshots())
    run(1, [(7, "z")], 1)
    table = lake.table("default.ds")
    assert table.to_pandas()["id"].tolist() == [7]
    assert len(table.snapshots()) == before + 1


def test_save_as_table_hands_the_writer_no_name(spark, tmp_path):
    """What a pipeline's @dp.materialized_view(format="arrowlake") does: saveAsTable."""
    lake = al.connect(tmp_path / "lake")
    lake.create_table("default.mv", pa.schema([("id", pa.int64())]))
    df = spark.range(3)
    with pytest.raises(Exception, match="PySpark hands the arrowlake writer no table name"):
        df.write.format("arrowlake").option("lake", str(tmp_path / "lake")).mode(
            "append").saveAsTable("mv_probe")
    assert lake.table("default.mv").count() == 0


def load_runner():
    sys.path.insert(0, str(EXAMPLE.parent))
    spec = importlib.util.spec_from_file_location("sdp_run", EXAMPLE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(PYSPARK < (4, 3), reason="examples/pipelines uses the `spark` global that "
                    "spark-pipelines defines from PySpark 4.3 (4.1's leaves it undefined)")
# slow: spark-pipelines runs the example in a process of its own, about 3 min on 2 cores.
@pytest.mark.slow
@pytest.mark.timeout(900)  # three spark-pipelines runs, each starting its own Spark
def test_example_pipeline_gold_equals_pandas(tmp_path, monkeypatch):
    """examples/pipelines under real ``spark-pipelines run`` processes."""
    # The Spark it starts runs this interpreter and the arrowlake under test.
    src = str(Path(al.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", src)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    runner = load_runner()
    with one_spark_pipelines_run():
        gold, expected = runner.main(["--work", str(tmp_path), "--rounds", "2", "--orders", "40"])
    assert len(expected) > 0
    assert gold.to_dict("records") == expected.to_dict("records")
    lake = al.connect(tmp_path / "lake")
    import pipeline_events

    orders, customers = pipeline_events.read_events(tmp_path / "raw")
    final = pipeline_events.final_state(orders, "order_id").sort_values("order_id")
    assert lake.table("default.bronze_orders").count() == len(orders)
    assert lake.table("default.bronze_customers").count() == len(customers)
    silver = lake.table("default.silver_orders").to_pandas().sort_values("order_id")
    assert silver["order_id"].tolist() == final["order_id"].tolist()
    assert silver["amount"].tolist() == final["amount"].tolist()
    # The sink (dp.create_sink + @dp.append_flow) names its table with options.
    assert lake.table("audit.order_deletes").count() == int((orders["op"] == "delete").sum())
    # table_properties stay in Spark's catalog: PySpark does not hand them to the writer.
    assert "write.target-file-size" not in lake.table("default.bronze_orders").properties
