"""The one-sort shortcut of a primary-key write (``unique_run_order``) against the per-group
deduplication it stands in for, and an upsert taking it end to end."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake.merge import ROW_KIND, Aggregation, Deduplicate, FirstRow, dedupe_within_write
from arrowlake.merge.engines import unique_run_order


def _rows(ids: list[int], parts: list[str], kinds: list[int]) -> pa.Table:
    n = len(ids)
    return pa.table({
        "p": pa.array(parts, pa.string()),
        "id": pa.array(ids, pa.int64()),
        "v": pa.array([f"v{i}" for i in range(n)]),
        ROW_KIND: pa.array(kinds, pa.int8()),
    })


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.sampled_from(["a", "b"]),
                          st.sampled_from([0, 0, 0, 2, 3])), min_size=1, max_size=60),
       st.integers(1, 4), st.sampled_from(["deduplicate", "first-row"]))
def test_one_sort_gives_each_group_what_dedupe_gives(rows, buckets, engine_name):
    ids, parts, kinds = (list(x) for x in zip(*rows, strict=True))
    table = _rows(ids, parts, kinds)
    engine = Deduplicate() if engine_name == "deduplicate" else FirstRow()
    groups = np.array([i % buckets + buckets * (p == "b") for i, p in zip(ids, parts,
                                                                          strict=True)])
    order = unique_run_order(table, ["p", "id"], groups, engine, constant=["p"])
    seen = list(zip(groups.tolist(), ids, strict=True))
    if len(set(seen)) < len(seen) or any(k not in (0, 2) for k in kinds):
        # Something to resolve: the shortcut must step aside.
        assert order is None
        return
    assert order is not None
    ordered = table.take(pa.array(order))
    ordered_groups = groups[order]
    for group in np.unique(groups):
        got = ordered.filter(pa.array(ordered_groups == group))
        expected = dedupe_within_write(table.filter(pa.array(groups == group)), ["p", "id"],
                                       engine, constant=["p"])
        assert got.equals(expected)


def test_engines_that_combine_versions_do_not_take_the_shortcut():
    table = _rows([1, 2], ["a", "a"], [0, 0])
    engine = Aggregation({"v": "last_value"})
    assert unique_run_order(table, ["id"], np.zeros(2, np.int64), engine) is None


@pytest.mark.parametrize("repeat", [False, True])
def test_upsert_writes_sorted_unique_runs_per_partition_and_bucket(sqlite_lake, repeat):
    schema = pa.schema([("p", pa.string()), ("id", pa.int64()), ("v", pa.int64())])
    table = sqlite_lake.create_table("db.t", schema, primary_key=["p", "id"],
                                     partition_by=["p"], buckets=3)
    rng = np.random.default_rng(3)
    ids = rng.permutation(2000)
    if repeat:
        ids = np.concatenate([ids, ids[:100]])  # later versions of 100 keys in one write
    data = pa.table({"p": pa.array(np.where(ids % 2 == 0, "x", "y")),
                     "id": pa.array(ids), "v": pa.array(np.arange(len(ids)))}, schema=schema)
    table.upsert(data)
    files = table.files()
    assert files.num_rows == 6  # 2 partitions x 3 buckets
    for path in files["path"].to_pylist():
        run = pq.read_table(path)
        assert run["p"].unique().to_pylist() in (["x"], ["y"])
        key = run["id"].to_numpy()
        assert np.all(key[1:] > key[:-1])  # sorted by key, no repeats
    got = {r["id"]: r["v"] for r in table.to_arrow().to_pylist()}
    last = {int(i): n for n, i in enumerate(ids)}
    assert got == last
