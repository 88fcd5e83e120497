"""Random histories of a deletion-vector table read by Spark's own Parquet reader (the fast
path of ``arrowlake.spark.read``): the same rows as a merge-on-read table fed the same history,
and never a split through the Python data source."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowlake as al
from tests.spark.helpers import as_spark_rows, frame_rows

pytest.importorskip("pyspark")

import arrowlake.spark as als

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("p", pa.string()),
                    ("v", pa.int64())])

row = st.tuples(st.integers(0, 60), st.sampled_from(["a", "b", "c"]), st.integers(-3, 3))
op = st.one_of(
    st.tuples(st.just("upsert"), st.lists(row, min_size=1, max_size=30)),
    st.tuples(st.just("changes"), st.lists(st.tuples(row, st.sampled_from(["+I", "-D"])),
                                           min_size=1, max_size=10)),
    st.tuples(st.just("delete"), st.integers(0, 60)),
    st.tuples(st.just("compact"), st.booleans()),
    st.tuples(st.just("delete_where"), st.integers(-3, 3)),
    st.tuples(st.just("overwrite"), st.lists(row, min_size=0, max_size=10)),
)


def _apply(table: al.Table, operation) -> None:
    name, arg = operation
    if name == "upsert":
        ids, ps, vs = zip(*arg, strict=True)
        table.upsert(pa.table({"id": ids, "p": ps, "v": vs}, schema=SCHEMA))
    elif name == "changes":
        ids, ps, vs = zip(*(r for r, _ in arg), strict=True)
        table.write_changes(pa.table({"id": ids, "p": ps, "v": vs,
                                      "op": [k for _, k in arg]}), row_kind="op")
    elif name == "compact":
        table.compact(full=arg)
    elif name == "delete_where":
        table.delete(al.col("v") > arg)
    elif name == "overwrite":
        where = "p = 'a'" if table.partition_by else None
        unique = list({r[0]: r for r in arg if where is None or r[1] == "a"}.values())
        data = pa.table({"id": [r[0] for r in unique], "p": [r[1] for r in unique],
                         "v": [r[2] for r in unique]}, schema=SCHEMA)
        table.overwrite(data, filter=where)
    else:
        table.delete(al.col("id") >= arg)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=5), buckets=st.integers(1, 8),
       partitioned=st.booleans())
def test_spark_fast_path_equals_merge_on_read(spark, tmp_path_factory, ops, buckets,
                                               partitioned):
    root = tmp_path_factory.mktemp("dv-spark")
    lake = al.connect(root)
    key = ["id", "p"] if partitioned else ["id"]
    dv, mor = (lake.create_table(f"s.{name}", SCHEMA, primary_key=key, buckets=buckets,
                                 partition_by=["p"] if partitioned else [],
                                 deletion_vectors=(name == "dv"))
               for name in ("dv", "mor"))
    for operation in ops:
        for table in (dv, mor):
            _apply(table, operation)
    plan = als.plan_read(spark, lake, "s.dv")
    assert not plan.source, plan.describe()
    expected = as_spark_rows(mor.to_arrow().sort_by([(k, "ascending") for k in key]), "id")
    got = frame_rows(als.read(spark, lake, "s.dv"), "id")
    assert sorted(got, key=lambda r: (r["id"], r["p"])) == \
        sorted(expected, key=lambda r: (r["id"], r["p"]))
    # A filter on a non-key column prunes files and row groups; positions stay right.
    query = "v >= 0"
    got = frame_rows(als.read(spark, lake, "s.dv", filter=query, columns=["id", "p"]), "id")
    want = as_spark_rows(mor.scan(query, ["id", "p"]).to_arrow(), "id")
    assert sorted(got, key=lambda r: (r["id"], r["p"])) == \
        sorted(want, key=lambda r: (r["id"], r["p"]))
    lake.close()
