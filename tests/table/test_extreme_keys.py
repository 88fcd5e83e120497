"""Keys at the extremes Arrow holds (issue 31, item 4).

A timestamp key of ``9999-12-31T23:59:59Z`` in a ``Europe/Berlin`` column (the end-of-time
sentinel of SCD2 data) is in year 10000 on the column's wall clock, which Python's datetime
cannot hold; int64 extremes are past any year it can hold; the smallest nanosecond is NaT to
pandas. Keys never go through Python datetimes on the key path (key ranges, lookups, the lookup
changelog, MERGE INTO, partition directories): every write, read, stream and compaction below
keeps them exact, in both modes, checked against a model of the table kept as integers.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import arrowlake as al
from arrowlake.expressions import AlwaysTrue, col
from arrowlake.io.stats import encode_scalar
from arrowlake.merge.runs import key_range
from arrowlake.table.keys.lookup import key_range_filter, literal_keys

I64 = np.iinfo(np.int64)
I32 = np.iinfo(np.int32)
END_OF_TIME_S = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())
PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
DAY_MS = 86_400_000


def extremes(typ: pa.DataType) -> list[int]:
    """Integer key values at the ends of what a table of ``typ`` can store (Parquet writes
    seconds as milliseconds and date64 as int32 days, so those ends are narrower), with the
    end-of-time sentinel and a few ordinary values."""
    if pa.types.is_timestamp(typ):
        low, high = int(I64.min), int(I64.max)
        if typ.unit == "s":
            low, high = -(-low // 1000), high // 1000
        sentinel = END_OF_TIME_S * PER_SECOND[typ.unit]
        values = [low, low + 1, -1, 0, 1, high - 1, high]
        return sorted({*values, sentinel} if sentinel <= high else set(values))
    if pa.types.is_date32(typ):
        return [int(I32.min), int(I32.min) + 1, -1, 0, 2_932_896, 2_932_897, int(I32.max)]
    if pa.types.is_date64(typ):
        return [int(I32.min) * DAY_MS, -DAY_MS, 0, 2_932_897 * DAY_MS, int(I32.max) * DAY_MS]
    day = 86_400 * PER_SECOND[typ.unit]
    return [0, 1, 999, day // 2, day - 1001, day - 1]


def keys_of(typ: pa.DataType, ints: list[int]) -> pa.Array:
    return pa.array(ints, pa.int32() if typ.bit_width == 32 else pa.int64()).cast(typ)


def ints_of(column: pa.ChunkedArray | pa.Array) -> list[int]:
    return column.cast(pa.int32() if column.type.bit_width == 32 else pa.int64()).to_pylist()


def state(t: al.Table) -> dict[int, int]:
    rows = t.to_arrow()
    return dict(zip(ints_of(rows.column("k")), rows.column("v").to_pylist(), strict=True))


def replayed(changes: list[pa.Table], start: dict[int, int] | None = None) -> dict[int, int]:
    model = dict(start or {})
    for rows in changes:
        for k, v, kind in zip(ints_of(rows.column("k")), rows.column("v").to_pylist(),
                              rows.column("_row_kind").to_pylist(), strict=True):
            if kind in ("+I", "+U"):
                model[k] = v
            else:
                assert model.pop(k) == v, (k, v, kind)
    return model


def history(t: al.Table, typ: pa.DataType) -> None:
    """Writes of every kind over the extreme keys, each checked against the model."""
    ints = extremes(typ)
    keys = keys_of(typ, ints)
    n = len(ints)
    model: dict[int, int] = {}

    def upsert(at: list[int], values: list[int]) -> None:
        t.upsert(pa.table({"k": keys.take(pa.array(at)), "v": pa.array(values, pa.int64())}))
        model.update({ints[i]: v for i, v in zip(at, values, strict=True)})
        assert state(t) == model

    upsert(list(range(0, n, 2)), [10 * i for i in range(0, n, 2)])
    first_state, first = dict(model), t.current_snapshot_id
    behind = t.stream(start="latest", stop_at_latest=True, include_row_kind=True,
                      catch_up_threshold=1)
    upsert(list(range(n)), list(range(n)))  # replaces the first keys, adds the others
    t.write_changes(pa.table({"k": keys.slice(1, 1), "v": pa.array([1], pa.int64()),
                              "op": ["-D"]}))
    del model[ints[1]]
    assert state(t) == model
    t.delete(col("v") == n - 1)  # the largest key, by a non-key filter
    del model[ints[n - 1]]
    assert state(t) == model
    # MERGE INTO matches the extreme keys: matched ones updated, the others inserted.
    source = pa.table({"k": keys, "v": pa.array(range(100, 100 + n), pa.int64())})
    result = t.merge(source, on="k").when_matched_update(set={"v": -1}) \
        .when_not_matched_insert().execute()
    assert (result.updated, result.inserted) == (len(model), n - len(model))
    model = {k: (-1 if k in model else 100 + i) for i, k in enumerate(ints)}
    assert state(t) == model
    t.compact(full=True)
    assert state(t) == model
    upsert([0, n - 1], [7, 8])  # looked up in the compacted files
    # Every change streamed, replayed, gives the table; so does catching up in one change.
    changes = [c.to_arrow() for c in t.stream(start=first, stop_at_latest=True,
                                              include_row_kind=True, catch_up_threshold=None)]
    assert replayed(changes) == model
    assert replayed([c.to_arrow() for c in behind], first_state) == model


TIMESTAMPS = [pa.timestamp(u, tz) for u in ("s", "ms", "us", "ns")
              for tz in (None, "Europe/Berlin")]
TIMESTAMPS += [pa.timestamp("s", "+14:00"), pa.timestamp("ms", "UTC"),
               pa.timestamp("us", "+14:00"), pa.timestamp("ns", "-12:00")]
OTHERS = [pa.date32(), pa.date64(), pa.time32("s"), pa.time32("ms"), pa.time64("us"),
          pa.time64("ns")]
MODES = {"dv-none": (True, "none"), "mor-lookup": (False, "lookup")}
#: In the default run: the issue's zone, NaT and a zone past pandas' range, seconds (stored as
#: milliseconds), dates, nanosecond times; every other type is in the slow run.
QUICK = [pa.timestamp("us", "Europe/Berlin"), pa.timestamp("ns", "-12:00"), pa.timestamp("s"),
         pa.date32(), pa.time64("ns")]
ALL_TYPES = [pytest.param(t, marks=() if t in QUICK else pytest.mark.slow, id=str(t))
             for t in TIMESTAMPS + OTHERS]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("typ", ALL_TYPES)
def test_extreme_keys_through_every_write_stream_and_compaction(sqlite_lake, typ, mode):
    vectors, producer = MODES[mode]
    t = sqlite_lake.create_table("s.t", pa.schema([pa.field("k", typ, nullable=False),
                                                   ("v", pa.int64())]),
                                 primary_key=["k"], buckets=2, deletion_vectors=vectors,
                                 changelog_producer=producer)
    history(t, typ)


@pytest.mark.parametrize(("vectors", "producer", "engine"), [
    (True, "lookup", "deduplicate"), (True, "none", "partial-update"),
    (False, "none", "deduplicate"), (False, "lookup", "partial-update")])
@pytest.mark.parametrize("typ", [pa.timestamp("us", "Europe/Berlin"),
                                 pytest.param(pa.timestamp("ns", "+14:00"), marks=pytest.mark.slow),
                                 pytest.param(pa.date32(), marks=pytest.mark.slow)], ids=str)
def test_extreme_keys_with_other_producers_and_engines(sqlite_lake, typ, vectors, producer,
                                                      engine):
    t = sqlite_lake.create_table("s.t", pa.schema([pa.field("k", typ, nullable=False),
                                                   ("v", pa.int64())]),
                                 primary_key=["k"], buckets=2, deletion_vectors=vectors,
                                 changelog_producer=producer, merge_engine=engine)
    history(t, typ)


@pytest.mark.parametrize("vectors", [True, False], ids=["dv", "mor"])
def test_scd2_end_of_time_in_a_berlin_column(sqlite_lake, vectors):
    """The issue's case: a composite key (id, valid_to) with 9999-12-31T23:59:59Z, partitioned
    by valid_to, in a Europe/Berlin column; an append table takes the same rows."""
    typ = pa.timestamp("us", "Europe/Berlin")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False),
                        pa.field("valid_to", typ, nullable=False), ("name", pa.string())])
    end = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    t = sqlite_lake.create_table("s.t", schema, primary_key=["id", "valid_to"],
                                 partition_by=["valid_to"], deletion_vectors=vectors,
                                 changelog_producer="lookup")
    start = t.stream(start="latest", stop_at_latest=True, include_row_kind=True,
                     catch_up_threshold=None)
    t.upsert(pa.table({"id": [1, 2], "valid_to": pa.array([end, end], typ),
                       "name": ["a", "b"]}, schema=schema))
    closed = datetime(2026, 1, 1, tzinfo=UTC)
    # Close version 1 of id 1 and open version 2: the SCD2 step.
    t.upsert(pa.table({"id": [1, 1], "valid_to": pa.array([closed, end], typ),
                       "name": ["a", "a2"]}, schema=schema))
    t.write_changes(pa.table({"id": [1], "valid_to": pa.array([end], typ), "name": ["a"],
                              "op": ["-D"]}, schema=schema.append(pa.field("op", pa.string()))))
    t.upsert(pa.table({"id": [1], "valid_to": pa.array([end], typ), "name": ["a3"]},
                      schema=schema))
    got = t.to_arrow()
    is_closed = pc.equal(got.column("valid_to"), pa.scalar(closed, typ)).to_pylist()
    assert sorted(zip(got.column("id").to_pylist(), is_closed, got.column("name").to_pylist(),
                      strict=True)) == [(1, False, "a3"), (1, True, "a"), (2, False, "b")]
    streamed = [sorted(zip(*(c.to_arrow().column(n).to_pylist()
                             for n in ("id", "name", "_row_kind")), strict=True))
                for c in start]
    assert streamed == [[(1, "a", "+I"), (2, "b", "+I")],
                        [(1, "a", "+I"), (1, "a", "-U"), (1, "a2", "+U")],
                        [(1, "a2", "-D")],
                        [(1, "a3", "+I")]]
    t.compact(full=True)
    assert t.count() == 3
    plain = sqlite_lake.create_table("s.a", schema)
    plain.append(pa.table({"id": [1], "valid_to": pa.array([end], typ), "name": ["a"]},
                          schema=schema))
    assert plain.count() == 1


@pytest.mark.parametrize("typ", TIMESTAMPS + OTHERS, ids=str)
def test_literal_keys_are_exact_or_refused(typ):
    ints = extremes(typ)
    keys = keys_of(typ, ints)
    literals = literal_keys(keys)
    if pa.types.is_time(typ) and typ.unit != "ns":  # every time of day has one
        assert literals is not None and ints_of(pa.array(literals, typ)) == ints
    else:
        assert literals is None  # some extreme has no exact Python value
    ordinary = (0,) if pa.types.is_time64(typ) and typ.unit == "ns" else (0, 1, -1, 999)
    inner = keys_of(typ, [v for v in ints if v in ordinary])
    got = literal_keys(inner)
    assert got is not None
    assert ints_of(pa.array(got, typ) if not pa.types.is_timestamp(typ) or typ.unit != "ns"
                   else inner) == ints_of(inner)
    # The range filter drops only the sides that have no literal: rows at the keys pass it.
    expr = key_range_filter("k", keys)
    table = pa.table({"k": keys})
    if not isinstance(expr, AlwaysTrue):
        assert al.expressions.evaluate(expr, table).to_pylist() == [True] * len(keys)


def test_time_keys_with_nanoseconds_are_not_truncated_into_literals():
    keys = pa.array([1, 1000], pa.int64()).cast(pa.time64("ns"))
    assert literal_keys(keys) is None
    assert literal_keys(keys.slice(1)) is not None


def test_key_bounds_compare_with_stored_key_ranges_as_integers():
    """Lookups prune files by their key ranges: the written keys' bounds are in the stored
    (integer) form, so an end-of-time key compares with them instead of failing."""
    typ = pa.timestamp("us", "Europe/Berlin")
    keys = keys_of(typ, [0, END_OF_TIME_S * 10**6])
    low, high = encode_scalar(keys[0]), encode_scalar(keys[1])
    assert (low, high) == (0, END_OF_TIME_S * 10**6)
    stored = key_range("[0]", f"[{END_OF_TIME_S * 10**6}]")
    assert stored is not None and stored[1][0] == high


def test_an_append_table_partitioned_by_the_end_of_time(sqlite_lake):
    """9999-12-31T23:59:59Z in a Berlin column is past year 9999 there: the partition's
    directory is named by the stored integer, as in key tables (it raised OverflowError)."""
    typ = pa.timestamp("us", "Europe/Berlin")
    t = sqlite_lake.create_table("s.scd", pa.schema([("valid_to", typ), ("v", pa.int64())]),
                                 partition_by=["valid_to"])
    end = pa.array([253402300799000000, 0], pa.int64()).cast(typ)
    t.append(pa.table({"valid_to": end, "v": [1, 2]}))
    got = t.to_arrow().sort_by("v")
    assert got.column("valid_to").cast(pa.int64()).to_pylist() == [253402300799000000, 0]
    assert t.scan(filter="v = 1").count() == 1
