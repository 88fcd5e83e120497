"""a09: generated filters of thousands of terms scan, count and delete real tables."""

from __future__ import annotations

import pyarrow as pa

from arrowlake.expressions import and_all, col

N = 10_000


def ors(column: str, values) -> str:
    return " or ".join(f"{column} = {v}" for v in values)


def test_a09_ten_thousand_ors_and_ands_scan_count_and_delete(sqlite_lake):
    t = sqlite_lake.create_table("s.t", pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    for start in range(0, 2 * N, N // 2):  # several files, so statistics prune some
        ids = list(range(start, start + N // 2))
        t.append({"id": ids, "x": [i / 2 for i in ids]})
    stream = t.stream(start="latest", include_row_kind=True, stop_at_latest=True)
    odd = range(1, 2 * N, 2)
    assert t.scan(filter=ors("id", odd)).count() == N
    operators = col("id") == 1
    for i in odd[1:]:
        operators = operators | (col("id") == i)
    assert t.scan(filter=operators).to_arrow().num_rows == N
    assert t.scan(filter=" and ".join(f"id != {i}" for i in odd)).count() == N
    # Float columns take another pushdown route (a range per term), and pairs cannot become
    # an IN list: Arrow evaluates every term, so fewer of them keep the test quick.
    assert t.scan(filter=ors("x", [i / 2 for i in odd[:2000]])).count() == 2000
    pairs = " or ".join(f"(id = {i} and x >= 0)" for i in range(2000))
    assert t.scan(filter=pairs).count() == 2000
    result = t.delete(ors("id", odd))
    assert result.removed_rows == N
    assert t.count() == N and t.scan(filter=ors("id", odd)).count() == 0
    # The delete's recorded filter (10,000 ORs as text) is parsed back by the stream.
    kinds = [r["_row_kind"] for c in stream for r in c.to_arrow().to_pylist()]
    assert kinds == ["-D"] * N


def test_a09_ten_thousand_ors_on_a_primary_key_table(sqlite_lake):
    t = sqlite_lake.create_table("s.k", pa.schema([("id", pa.int64()), ("v", pa.string())]),
                                 primary_key=["id"], buckets=2)
    t.upsert({"id": list(range(2 * N)), "v": ["a"] * (2 * N)})
    t.upsert({"id": list(range(0, 2 * N, 4)), "v": ["b"] * (N // 2)})  # a merge per bucket
    evens = range(0, 2 * N, 2)
    assert t.scan(filter=ors("id", evens)).count() == N
    assert t.scan(filter=and_all(col("id") != i for i in evens)).count() == N
    t.delete(ors("id", evens))
    assert t.count() == N
