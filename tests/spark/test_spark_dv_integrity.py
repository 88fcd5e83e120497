"""A data file read with its deletion vector must be the file the vector was written for: Spark
tells files apart by size when it drops deleted rows, so a file replaced behind the table's
back fails the read instead of dropping another file's rows."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowlake as al

pytest.importorskip("pyspark")

import arrowlake.spark as als
import arrowlake.spark.fast  # als.fast below

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])


@pytest.mark.parametrize("method", ["list", "bitmap", "join"])
def test_a_replaced_data_file_fails_the_read(spark, tmp_path, monkeypatch, method):
    if method != "list":
        monkeypatch.setattr(als.fast, "LIST_DELETES", 0)
    if method == "join":
        monkeypatch.setattr(als.fast, "BITMAP_BYTES", 0)
        monkeypatch.setattr(als.fast, "BITMAP_MAX_BYTES", 0)
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.dv", SCHEMA, primary_key=["id"], buckets=1, deletion_vectors=True,
                          properties={"deletion-vectors.rewrite-threshold": "1"})
    t.upsert({"id": list(range(100)), "v": [0] * 100})
    t.upsert({"id": [5, 6], "v": [1, 1]})
    plan = als.plan_read(spark, lake, "s.dv")
    assert method in plan.describe().replace("anti-join", "join"), plan.describe()
    assert sorted(r.id for r in als.read(spark, lake, "s.dv").collect()) == list(range(100))
    [first] = [p for p in t.files()["path"].to_pylist() if p.endswith(".parquet")
               and pq.read_metadata(p).num_rows == 100]
    # Same schema and rows, another size (no compression).
    pq.write_table(pq.read_table(first), first, compression="none")
    with pytest.raises(Exception, match="changed after it was written"):
        als.read(spark, lake, "s.dv").collect()
    lake.close()
