"""a09: a generated filter of thousands of terms reads through Spark (the fast path hands the
filter to Spark as a Column expression; primary-key buckets go through the data source).
Sizes stay past the old failure (about 1,000 terms) but small: every term that is not part of
an IN list costs Spark JVM calls, so 10,000 of them take minutes there (the expressions'
own tests take 10,000)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import arrowlake as al

pytest.importorskip("pyspark")

import arrowlake.spark as als

N = 3000


def ors(n: int) -> str:
    return " OR ".join(f"id = {i}" for i in range(1, 2 * n, 2))


def test_a09_thousands_of_ors_read_through_spark(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", pa.schema([("id", pa.int64()), ("v", pa.int64())]))
    t.append({"id": list(range(2 * N)), "v": list(range(2 * N))})
    assert als.read(spark, lake, "s.t", filter=ors(N)).count() == N
    pairs = " OR ".join(f"(id = {i} AND v >= 0)" for i in range(1, 2 * 100, 2))
    assert als.read(spark, lake, "s.t", filter=pairs).count() == 100
    k = lake.create_table("s.k", pa.schema([("id", pa.int64()), ("v", pa.int64())]),
                          primary_key=["id"], buckets=2)
    k.upsert({"id": list(range(2 * N)), "v": [0] * (2 * N)})
    k.upsert({"id": list(range(0, 2 * N, 3)), "v": [1] * len(range(0, 2 * N, 3))})
    assert als.read(spark, lake, "s.k", filter=ors(N)).count() == N
