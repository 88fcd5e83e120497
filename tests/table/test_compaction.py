"""Compaction without spikes: which runs are picked, the per-write budget, the knobs as table
properties, and what a write reports of the compaction it triggered."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowlake as al
from arrowlake.errors import DataFileError, ValidationError
from arrowlake.table.maintenance.compaction import CompactionOptions, compaction_options, pick_runs
from arrowlake.table.options.primary_key import DEFAULT_RUN_CACHE_BYTES, run_cache_bytes
from tests.conftest import METASTORES, make_lake
from tests.table.test_pk_properties import (
    ENGINE_PROPERTIES,
    ENGINES,
    Model,
    apply,
    check,
    operations,
    schema_for,
    sorted_rows,
)

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("pad", pa.float64())])


def batch(ids, name: str = "x") -> pa.Table:
    """Rows of ``ids`` named ``name{id}``; random padding makes file sizes follow row counts."""
    ids = list(ids)
    pad = np.random.default_rng(len(ids)).random(len(ids))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"{name}{i}" for i in ids],
                     "pad": pad}, schema=SCHEMA)


def names(table: al.Table) -> dict[int, str]:
    return {r["id"]: r["name"] for r in table.to_arrow().to_pylist()}


def runs_per_bucket(table: al.Table) -> dict[int, int]:
    files = table.files()
    counts: dict[int, int] = {}
    for bucket in files["bucket"].to_pylist():
        counts[bucket] = counts.get(bucket, 0) + 1
    return counts


# -- which runs are picked (sizes oldest first) ----------------------------------------------------


def test_new_runs_half_the_base_leave_the_base_alone():
    # The case: a base run and five upserts of a tenth of its size each.
    assert pick_runs([100, 10, 10, 10, 10, 10], CompactionOptions()) == 5


def test_size_amplification_over_the_limit_merges_the_whole_bucket():
    sizes = [100, 150, 30, 30]  # newer runs hold 210% of the oldest
    assert pick_runs(sizes, CompactionOptions()) == 4
    # Under a higher limit only the two alike newest runs merge (150 > 1.5 x 60).
    assert pick_runs(sizes, CompactionOptions(max_size_amplification_percent=300)) == 2
    assert pick_runs([100, 150, 50], CompactionOptions()) == 0  # exactly 200%: not over
    assert pick_runs([100, 151, 50], CompactionOptions()) == 3


def test_size_ratio_decides_how_far_back_a_merge_reaches():
    sizes = [1000, 40, 20, 10, 10]
    assert pick_runs(sizes, CompactionOptions(size_ratio=1.0)) == 4  # 10, 10, 20 <= 20, 40 <= 40
    assert pick_runs(sizes, CompactionOptions(size_ratio=1.5)) == 4
    assert pick_runs([1000, 40, 25, 10, 10], CompactionOptions(size_ratio=1.0)) == 2
    assert pick_runs([1000, 10], CompactionOptions()) == 0  # nothing alike to merge


def test_too_many_runs_force_a_merge_of_the_newest():
    sizes = [1000, 500, 200, 100, 50, 20]  # each run far bigger than the newer ones together
    options = CompactionOptions(size_ratio=1.0, max_runs=5)
    assert pick_runs(sizes, CompactionOptions(size_ratio=1.0, max_runs=10)) == 0
    # Over max-runs (5): the two newest merge, leaving five runs.
    assert pick_runs(sizes, options) == 2
    assert pick_runs(sizes, CompactionOptions(size_ratio=1.0, max_runs=3)) == 4


def test_the_oldest_run_joins_only_for_size_amplification():
    # The newer runs add up to the oldest one: a size ratio of 1 would take it too, but
    # rewriting it is left until the newer runs exceed 200% of it.
    assert pick_runs([100, 40, 30, 30], CompactionOptions(size_ratio=1.0)) == 3
    assert pick_runs([100, 120, 50, 31], CompactionOptions(size_ratio=1.0)) == 4
    # Over max-runs, all the newer runs merge and the oldest stays, the size of them all...
    assert pick_runs([110] + [10] * 11, CompactionOptions(max_runs=10)) == 11
    # ...unless only one run may be left.
    assert pick_runs([100, 10], CompactionOptions(max_runs=1)) == 2
    assert pick_runs([100, 10], CompactionOptions(max_runs=2)) == 0


def test_keep_oldest_never_picks_the_oldest_run():
    sizes = [100, 300, 10, 10]
    assert pick_runs(sizes, CompactionOptions()) == 4  # size amplification
    assert pick_runs(sizes, CompactionOptions(), keep_oldest=True) == 2
    assert pick_runs([100, 10], CompactionOptions(), keep_oldest=True) == 0
    assert pick_runs([100], CompactionOptions()) == 0


# -- the knobs as table properties -----------------------------------------------------------------


def test_compaction_options_defaults_and_values():
    assert compaction_options({}) == CompactionOptions(10, 1.0, 200, 5.0)
    assert compaction_options({
        "compaction.max-runs": "8", "compaction.size-ratio": "2",
        "compaction.max-size-amplification-percent": "0", "compaction.write-budget": "0.5",
    }) == CompactionOptions(8, 2.0, 0, 0.5)


@pytest.mark.parametrize("name,value", [
    ("compaction.max-runs", "0"), ("compaction.max-runs", "2.5"), ("compaction.max-runs", "x"),
    ("compaction.size-ratio", "0.5"), ("compaction.size-ratio", "nan"),
    ("compaction.max-size-amplification-percent", "-1"),
    ("compaction.max-size-amplification-percent", "50%"),
    ("compaction.write-budget", "0"), ("compaction.write-budget", "inf"),
])
def test_malformed_compaction_property_is_named(name, value):
    with pytest.raises(ValidationError, match=f"'{name}'"):
        compaction_options({name: value})


@pytest.mark.parametrize("kind", METASTORES)
def test_malformed_compaction_property_writes_nothing(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    with pytest.raises(ValidationError, match="compaction.size-ratio"):
        lake.create_table("c.bad", SCHEMA, primary_key=["id"],
                          properties={"compaction.size-ratio": "small"})
    assert not lake.table_exists("c.bad")
    table = lake.create_table("c.ok", SCHEMA, primary_key=["id"])
    before = table.properties
    with pytest.raises(ValidationError, match="compaction.max-size-amplification-percent"):
        table.set_properties(**{"compaction.max-size-amplification-percent": "lots",
                                "compaction.max-runs": "9"})
    assert lake.table(table.name).properties == before
    table.set_properties(**{"compaction.write-budget": "2"})
    assert lake.table(table.name).properties["compaction.write-budget"] == "2"
    lake.close()


# -- compaction inside writes -----------------------------------------------------------------


@pytest.mark.parametrize("kind", METASTORES)
def test_tenth_upsert_merges_the_small_runs_and_reports_it(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table("c.t", SCHEMA, deletion_vectors=False, primary_key=["id"], buckets=1)
    assert table.properties["compaction.max-runs"] == "10"
    table.upsert(batch(range(20_000), "base"))
    base_file = table.files()["file_id"][0].as_py()
    results = [table.upsert(batch(range(i * 1000, i * 1000 + 2000), f"u{i}")) for i in range(10)]
    assert [r.compaction for r in results[:9]] == [None] * 9
    done = results[9].compaction
    assert done is not None
    assert done.snapshot_id == results[9].snapshot_id + 1
    # The ten newer runs together are the size of the base run, which stays.
    assert (done.buckets, done.removed_files, done.added_files) == (1, 10, 1)
    assert done.removed_bytes > done.added_bytes > 0  # overlapping keys merged away
    assert table.snapshots()["kind"].to_pylist()[-1] == "compact"
    files = table.files()
    assert files.num_rows == 2 and base_file in files["file_id"].to_pylist()
    got = names(table)
    assert len(got) == 20_000 and got[0] == "u00" and got[4500] == "u44500"
    assert got[10_999] == "u910999" and got[11_000] == "base11000"
    lake.close()


def test_a_write_compacts_within_its_budget_and_later_writes_catch_up(sqlite_lake):
    # Every newer run makes a whole-bucket merge due; a tiny budget lets one bucket merge whole
    # per write and the others wait (their newer runs alone cost more than the budget too).
    table = sqlite_lake.create_table("c.budget", SCHEMA, primary_key=["id"], buckets=4,
                                     properties={"compaction.max-runs": "2",
                                                 "compaction.max-size-amplification-percent": "0",
                                                 "compaction.write-budget": "0.01"})
    table.upsert(batch(range(4000), "base"))
    expected = {i: f"base{i}" for i in range(4000)}
    table.upsert(batch(range(0, 4000, 7), "a"))
    expected.update({i: f"a{i}" for i in range(0, 4000, 7)})
    assert set(runs_per_bucket(table).values()) == {2}
    for n in range(6):
        result = table.upsert(batch(range(n, 4000, 11), f"w{n}"))
        expected.update({i: f"w{n}{i}" for i in range(n, 4000, 11)})
        assert result.compaction is not None and result.compaction.buckets == 1
        assert result.compaction.removed_files >= 3  # a whole bucket: its base run and more
        assert names(table) == expected
    counts = runs_per_bucket(table)
    assert min(counts.values()) == 1 and max(counts.values()) > 2  # some still wait
    # With a large budget one write merges every due bucket.
    table.set_properties(**{"compaction.write-budget": "100"})
    result = table.upsert(batch(range(0, 4000, 13), "z"))
    expected.update({i: f"z{i}" for i in range(0, 4000, 13)})
    assert result.compaction is not None and result.compaction.buckets >= 3
    assert max(runs_per_bucket(table).values()) <= 2
    assert names(table) == expected


def test_manual_compact_reports_bytes(sqlite_lake):
    table = sqlite_lake.create_table("c.manual", SCHEMA, primary_key=["id"], buckets=2,
                                     properties={"compaction.max-runs": "50"})
    table.upsert(batch(range(1000)))
    table.upsert(batch(range(500), "y"))
    result = table.compact(full=True)
    assert (result.buckets, result.removed_files, result.added_files) == (2, 4, 2)
    assert result.removed_bytes > 0 and result.added_bytes == sum(table.files()["file_size"]
                                                                  .to_pylist())


# -- the writer's cache of decoded runs ---------------------------------------------------------


def _overwrite_data_files(table: al.Table) -> None:
    """Make every live data file of ``table`` unreadable (a test's stand-in for a file the
    writer no longer needs to read)."""
    for path in table.files()["path"].to_pylist():
        with open(path, "wb") as f:
            f.write(b"not parquet")


@pytest.mark.parametrize("cache, reads_files", [("1000000", False), ("0", True), (None, True)])
def test_compaction_merges_the_runs_its_writer_keeps_decoded(sqlite_lake, cache, reads_files):
    """A writer keeps the runs it wrote decoded (``write.run-cache-size``, off by default
    without a lookup changelog), and its compactions merge those instead of reading the files
    back; with the cache off they read the files."""
    # The third write merges the whole bucket: nothing is left that reads the old files.
    props = {"compaction.max-runs": "2", "compaction.max-size-amplification-percent": "0"}
    if cache is not None:
        props["write.run-cache-size"] = cache
    table = sqlite_lake.create_table("c.cached", SCHEMA, primary_key=["id"], buckets=1,
                                     deletion_vectors=False,
                                     properties=props)
    table.upsert(batch(range(100)))
    table.upsert(batch(range(50, 150), "y"))
    _overwrite_data_files(table)
    result = table.upsert(batch(range(120, 130), "z"))
    if reads_files:
        # The write landed; its compaction failed reading the files (logged, left for later).
        assert result.compaction is None
        with pytest.raises(DataFileError):
            table.compact()
        return
    assert result.compaction is not None and result.compaction.removed_files == 3
    expected = {i: f"{'x' if i < 50 else 'y' if i < 120 or i >= 130 else 'z'}{i}"
                for i in range(150)}
    assert names(table) == expected


@pytest.mark.parametrize("name", ["write.run-cache-size", "changelog.lookup-cache-size"])
@pytest.mark.parametrize("value", ["-1", "lots", "1.5"])
def test_malformed_run_cache_size_is_named(sqlite_lake, name, value):
    with pytest.raises(ValidationError, match=name):
        sqlite_lake.create_table("c.badcache", SCHEMA, primary_key=["id"],
                                 properties={name: value})


def test_the_run_cache_is_on_by_default_for_lookups_and_the_older_property_wins():
    assert run_cache_bytes({}) == 0
    assert run_cache_bytes({"changelog-producer": "lookup"}) == DEFAULT_RUN_CACHE_BYTES
    assert run_cache_bytes({"changelog-producer": "lookup", "write.run-cache-size": "0"}) == 0
    assert run_cache_bytes({"write.run-cache-size": "10"}) == 10
    assert run_cache_bytes({"write.run-cache-size": "10",
                            "changelog.lookup-cache-size": "0"}) == 0


# -- exactness under aggressive auto-compaction, every engine -----------------------------------

_names = itertools.count()


@pytest.fixture(scope="module")
def knob_lake(tmp_path_factory):
    with al.connect(str(tmp_path_factory.mktemp("compaction-knobs"))) as lake:
        yield lake


@pytest.mark.parametrize("engine", list(ENGINES))
@settings(max_examples=int(os.environ.get("PK_PROPERTY_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), buckets=st.integers(1, 4), partitioned=st.booleans(),
       max_runs=st.sampled_from(["1", "2", "3"]),
       amplification=st.sampled_from(["0", "50", "200", "100000"]),
       ratio=st.sampled_from(["1", "1.5", "4"]), budget=st.sampled_from(["0.01", "1", "5"]),
       cache=st.sampled_from(["0", "256", "268435456"]))
def test_auto_compaction_keeps_every_snapshot_exact(knob_lake, engine, data, buckets,
                                                    partitioned, max_runs, amplification,
                                                    ratio, budget, cache):
    """Random writes with every combination of the knobs (a budget so small that merges wait,
    newer runs merged alone or whole buckets; compactions reading runs from files, from the
    writer's cache of decoded runs, or both) read as the model says, now and at every
    snapshot."""
    ops = data.draw(operations(partitioned, engine), label="operations")
    schema = schema_for(partitioned)
    key = ("k", "p") if partitioned else ("k",)
    table = knob_lake.create_table(
        f"knobs.t{next(_names)}", schema, primary_key=list(key), buckets=buckets,
        partition_by=["p"] if partitioned else [],
        properties={"compaction.max-runs": max_runs,
                    "compaction.max-size-amplification-percent": amplification,
                    "compaction.size-ratio": ratio, "compaction.write-budget": budget,
                    "write.run-cache-size": cache, **ENGINE_PROPERTIES.get(engine, {})},
        **ENGINES[engine])
    model = Model(engine, key)
    at_snapshot = {}
    for op in ops:
        apply(table, model, schema, op)
        check(table, model)
        state = sorted_rows(model.rows().values(), key)
        for snap in table.snapshots().column("snapshot_id").to_pylist():
            at_snapshot.setdefault(snap, state)
    for snap, state in at_snapshot.items():
        got = table.scan(snapshot=snap).to_arrow().to_pylist()
        assert sorted_rows(got, key) == state, f"time travel to snapshot {snap}"
