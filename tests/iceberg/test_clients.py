"""pyiceberg 0.12 and DuckDB 1.5.5 read published metadata by path, row for row as arrowlake
scans the table: after appends, deletes, upserts, schema changes, at every snapshot (by id,
by time and by tag), on partitioned tables with composite keys, with every type that maps.

The clients run in their own environment without arrowlake (tests/client_envs.py); each test
makes its reads in one process of it.
"""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import numpy as np
import pyarrow as pa

from arrowlake.iceberg import publish, publisher
from arrowlake.io import puffin
from tests.iceberg.helpers import ENGINES, Read, assert_same_rows, read_all

EVENTS = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.float64()),
                    ("d", pa.date32()), ("ts", pa.timestamp("us"))])


def _events(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    values = [None if i % 7 == 0 else float("nan") if i % 11 == 0 else i / 4 for i in ids]
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "k": pa.array([None if i % 5 == 0 else f"k{i % 13}" for i in ids]),
        "v": pa.array(values, pa.float64()),
        "d": pa.array([date(2026, 1, 1) + timedelta(days=int(i % 4)) for i in ids]),
        "ts": pa.array([datetime(2026, 1, 1) + timedelta(minutes=int(i)) for i in ids],
                       pa.timestamp("us")),
    }, EVENTS)


def _snapshot_reads(location: str, snapshots: list[int]) -> list[Read]:
    return [Read(engine, location, snapshot_id=s) for engine in ENGINES for s in snapshots]


def test_append_table_at_every_snapshot_by_id_time_and_tag(sqlite_lake, iceberg_clients,
                                                          tmp_path):
    events = sqlite_lake.create_table("shop.events", EVENTS)
    events.append(_events(0, 40))
    events.append(_events(40, 40))
    events.create_tag("two-appends")
    events.delete("id < 10 or v > 15")  # files rewritten in part
    events.append(_events(80, 5))
    replacement = _events(100, 20)
    replacement = replacement.set_column(3, "d", pa.array([date(2026, 1, 2)] * 20))
    events.overwrite(replacement, "d = date '2026-01-02'")
    history = events.history()
    snapshots = [h["snapshot_id"] for h in history]
    location = events.iceberg_metadata_location()
    middle = history[2]["committed_at"]  # a datetime (UTC) of the delete's commit
    reads = [Read(engine, location) for engine in ENGINES]
    reads += _snapshot_reads(location, snapshots)
    at_ms = int(middle.timestamp() * 1000)
    reads += [Read(engine, location, timestamp_ms=at_ms) for engine in ENGINES]
    reads += [Read("pyiceberg", location, ref="two-appends")]
    empty = sqlite_lake.create_table("shop.empty", EVENTS)  # no snapshot yet
    reads += [Read(engine, empty.iceberg_metadata_location()) for engine in ENGINES]
    got = iter(read_all(iceberg_clients, reads, tmp_path))
    for engine in ENGINES:
        assert_same_rows(events.scan().to_arrow(), next(got), ["id"], f"{engine} current")
    for engine in ENGINES:
        for s in snapshots:
            assert_same_rows(events.scan(snapshot=s).to_arrow(), next(got), ["id"],
                             f"{engine} snapshot {s}")
    for engine in ENGINES:
        assert_same_rows(events.scan(as_of=middle).to_arrow(), next(got), ["id"],
                         f"{engine} as of {middle}")
    assert_same_rows(events.scan(tag="two-appends").to_arrow(), next(got), ["id"], "tag")
    for engine in ENGINES:
        assert_same_rows(empty.scan().to_arrow(), next(got), ["id"], f"{engine} empty table")


USERS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def _users(ids: np.ndarray, tag: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "name": pa.array([f"{tag}{i}" for i in ids]),
                     "score": pa.array([float(i % 97) if i % 10 else None for i in ids])},
                    USERS)


def test_deletion_vectors_inline_and_in_puffin_files(sqlite_lake, iceberg_clients, tmp_path):
    """Upserts that replace rows spread over files (large vectors, in Puffin files holding
    several) and a delete of a range (small vectors, kept in the metastore): every vector is
    published in a Puffin file of its own, which DuckDB needs to apply the right one."""
    users = sqlite_lake.create_table(
        "crm.users", USERS, primary_key=["id"], buckets=2,
        deletion_vectors=True, properties={"compaction.mode": "off"})
    rng = np.random.default_rng(7)
    users.upsert(_users(np.arange(20_000), "a"))
    for round_ in range(3):
        users.upsert(_users(rng.choice(24_000, 6_000, replace=False), f"u{round_}"))
    users.delete("id >= 1000 and id < 1500")
    store = sqlite_lake.metastore
    vectors = store.live_vectors(users._record.table_id, users.current_snapshot_id).values()
    assert {v.blob is None for v in vectors} == {True, False}  # in Puffin files and inline
    shared = {v.puffin_path for v in vectors if v.puffin_path is not None}
    assert any(len(puffin.read_footer(users._storage, users._storage.join(users.location, p)))
               > 1 for p in shared)  # arrowlake's own Puffin files hold several vectors
    location = users.iceberg_metadata_location()
    snapshots = [h["snapshot_id"] for h in users.history()]
    reads = [Read(engine, location) for engine in ENGINES]
    reads += _snapshot_reads(location, snapshots)
    reads.append(Read("manifests", location))
    got = read_all(iceberg_clients, reads, tmp_path)
    for engine, found in zip(ENGINES, got[:2], strict=True):
        assert_same_rows(users.scan().to_arrow(), found, ["id"], engine)
    for i, (engine, s) in enumerate((e, s) for e in ENGINES for s in snapshots):
        assert_same_rows(users.scan(snapshot=s).to_arrow(), got[2 + i], ["id"],
                         f"{engine} snapshot {s}")
    current = got[-1][str(users.current_snapshot_id)]
    dvs = [e for m in current for e in m["entries"] if e["content"] == 1 and e["status"] != 2]
    assert len(dvs) == len(vectors)
    assert len({e["path"] for e in dvs}) == len(dvs)  # one vector per Puffin file
    for e in dvs:
        assert len(puffin.read_footer(users._storage, e["path"])) == 1


def test_schema_evolution_add_rename_drop_widen(sqlite_lake, iceberg_clients, tmp_path):
    t = sqlite_lake.create_table("shop.items", pa.schema([
        ("id", pa.int64()), ("qty", pa.int32()), ("price", pa.float32()),
        ("note", pa.string()), ("gone", pa.string())]))
    t.append(pa.table({"id": [1, 2, 3], "qty": pa.array([1, 2, None], pa.int32()),
                       "price": pa.array([1.5, None, 2.5], pa.float32()),
                       "note": ["a", None, "c"], "gone": ["x", "y", "z"]}))
    t.add_column("color", pa.string())
    t.append(pa.table({"id": [4], "qty": pa.array([4], pa.int32()),
                       "price": pa.array([4.5], pa.float32()), "note": ["d"],
                       "gone": ["w"], "color": ["red"]}))
    t.rename_column("note", "comment")
    t.drop_column("gone")
    t.alter_column("qty", pa.int64())
    t.alter_column("price", pa.float64())
    t.append(pa.table({"id": [5], "qty": [2**40], "price": [1e300], "comment": ["e"],
                       "color": [None]}))
    t.delete("id = 2")
    snapshots = [h["snapshot_id"] for h in t.history()]
    location = t.iceberg_metadata_location()
    reads = [Read(engine, location) for engine in ENGINES]
    reads += _snapshot_reads(location, snapshots)
    got = iter(read_all(iceberg_clients, reads, tmp_path))
    for engine in ENGINES:
        assert_same_rows(t.scan().to_arrow(), next(got), ["id"], f"{engine} current")
    for engine in ENGINES:
        for s in snapshots:
            # Each snapshot in the schema it was written in (as arrowlake reads it).
            assert_same_rows(t.scan(snapshot=s).to_arrow(), next(got), ["id"],
                             f"{engine} snapshot {s}")


def test_partitioned_tables_with_a_composite_key(sqlite_lake, iceberg_clients, tmp_path):
    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("day", pa.date32()),
                        ("amount", pa.decimal128(18, 4))])
    orders = sqlite_lake.create_table("shop.orders", schema, primary_key=["region", "id"],
                                      partition_by=["region"], buckets=2,
                                      deletion_vectors=True,
                                      properties={"compaction.mode": "off"})

    def rows(ids: range, tag: int) -> pa.Table:
        return pa.table({"region": [("eu", "us", "apac")[i % 3] for i in ids],
                         "id": list(ids),
                         "day": [date(2026, 11, 1 + i % 2) for i in ids],
                         "amount": [Decimal(i * 10 + tag) / 100 for i in ids]}, schema)

    orders.upsert(rows(range(300), 1))
    orders.upsert(rows(range(100, 200), 2))
    orders.upsert(rows(range(250, 400), 3))
    orders.delete("region = 'eu' and id < 50")
    location = orders.iceberg_metadata_location()
    metadata = publish(orders).metadata
    assert [(f["name"], f["transform"]) for f in metadata["partition-specs"][0]["fields"]] \
        == [("region", "identity")]  # never the buckets: they use arrowlake's own hash
    assert metadata["schemas"][-1]["identifier-field-ids"] == [1, 2]

    events = sqlite_lake.create_table("shop.events", EVENTS, partition_by=["d", "k"])
    events.append(_events(0, 60))
    events.append(_events(60, 60))
    events.delete("id < 20 or (id > 70 and id < 90)")
    by_day = events.iceberg_metadata_location()
    reads = [Read(engine, location) for engine in ENGINES]
    reads += [Read("duckdb", location, sql="region = 'us' and id >= 150"),
              Read("pyiceberg", location, pyiceberg_filter="region = 'us' and id >= 150")]
    reads += [Read(engine, by_day) for engine in ENGINES]
    reads += [Read("duckdb", by_day, sql="d = DATE '2026-01-02' and k is null"),
              Read("pyiceberg", by_day, pyiceberg_filter="d = '2026-01-02' and k is null")]
    got = iter(read_all(iceberg_clients, reads, tmp_path))
    for engine in ENGINES:
        assert_same_rows(orders.scan().to_arrow(), next(got), ["region", "id"], engine)
    expected = orders.scan("region = 'us' and id >= 150").to_arrow()
    assert expected.num_rows > 0
    for engine in ENGINES:
        assert_same_rows(expected, next(got), ["region", "id"], f"{engine} filtered")
    for engine in ENGINES:
        assert_same_rows(events.scan().to_arrow(), next(got), ["id"], engine)
    expected = events.scan("d = '2026-01-02' and k is null").to_arrow()
    assert expected.num_rows > 0
    for engine in ENGINES:
        assert_same_rows(expected, next(got), ["id"], f"{engine} filtered by partition")


def test_types_that_map(sqlite_lake, iceberg_clients, tmp_path):
    """Every Arrow type with an Iceberg counterpart, nulls, NaN and -0.0 included."""
    n = 6
    data = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "b": pa.array([True, False, None, True, False, True]),
        "i8": pa.array([-128, 0, None, 127, 1, 2], pa.int8()),
        "i16": pa.array([-300, 0, 5, None, 1, 2], pa.int16()),
        "i32": pa.array([-(2**31), 2**31 - 1, 0, 1, None, 3], pa.int32()),
        "f32": pa.array([1.5, float("nan"), None, -0.0, 2.0, 3.0], pa.float32()),
        "dec": pa.array([Decimal("1.10"), Decimal("-2.25"), None, Decimal("0.00"),
                         Decimal("99999.99"), Decimal("1.01")], pa.decimal128(7, 2)),
        "bin": pa.array([b"\x00\x01", b"", None, b"x", b"yz", b"q"], pa.binary()),
        "fix": pa.array([b"abcd", b"efgh", None, b"ijkl", b"mnop", b"qrst"],
                        pa.binary(4)),
        "day": pa.array([date(1970, 1, 1), date(2026, 11, 28), None, date(1900, 1, 1),
                         date(2100, 12, 31), date(2000, 2, 29)]),
        "t": pa.array([time(0, 0), time(23, 59, 59, 999999), None, time(12), time(1),
                       time(2)], pa.time64("us")),
        "ts": pa.array([datetime(2026, 1, 1, 12, 30, 1, 5), None, datetime(1969, 12, 31),
                        datetime(2026, 6, 1), datetime(2000, 1, 1), datetime(2010, 1, 1)],
                       pa.timestamp("us")),
        "tstz": pa.array([datetime(2026, 1, 1, 12, tzinfo=UTC), None,
                          datetime(2026, 6, 1, tzinfo=UTC), datetime(1999, 1, 1, tzinfo=UTC),
                          datetime(2001, 1, 1, tzinfo=UTC), datetime(2002, 1, 1, tzinfo=UTC)],
                         pa.timestamp("us", tz="UTC")),
        "s": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": "y"}, {"a": 4, "b": None},
                       {"a": 5, "b": "z"}, {"a": 6, "b": "w"}],
                      pa.struct([("a", pa.int32()), ("b", pa.string())])),
        "l": pa.array([[1, 2], [], None, [None, 4], [5], [6, 7, 8]], pa.list_(pa.int64())),
        "m": pa.array([[("k", 1)], [], None, [("a", None), ("b", 2)], [("c", 3)], [("d", 4)]],
                      pa.map_(pa.string(), pa.int64())),
    })
    t = sqlite_lake.create_table("shop.types", data.schema)
    t.append(data.slice(0, 3))
    t.append(data.slice(3))
    location = t.iceberg_metadata_location()
    # Iceberg v3's timestamp_ns and timestamptz_ns: pyiceberg reads them; DuckDB 1.5.5 does
    # not know these types yet (it fails on the table, never reads it wrong).
    nanos = pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        "ns": pa.array([1_700_000_000_123_456_789, None, -1], pa.timestamp("ns")),
        "nstz": pa.array([1_700_000_000_123_456_789, 0, None], pa.timestamp("ns", tz="UTC")),
    })
    n = sqlite_lake.create_table("shop.nanos", nanos.schema)
    n.append(nanos)
    ns_location = n.iceberg_metadata_location()
    types = {f["name"]: f["type"] for f in publish(n).metadata["schemas"][-1]["fields"]}
    assert (types["ns"], types["nstz"]) == ("timestamp_ns", "timestamptz_ns")
    reads = [Read(engine, loc) for loc in (location, ns_location) for engine in ENGINES]
    found, duck, found_ns, duck_ns = read_all(iceberg_clients, reads, tmp_path)
    expected = t.scan().to_arrow()
    assert_same_rows(expected, found, ["id"], "pyiceberg")
    assert_same_rows(expected, duck, ["id"], "duckdb")
    assert_same_rows(n.scan().to_arrow(), found_ns, ["id"], "pyiceberg, nanoseconds")
    if isinstance(duck_ns, Exception):
        assert "Unrecognized primitive type: timestamp" in str(duck_ns)
    else:  # a DuckDB that knows them must read them right
        assert_same_rows(n.scan().to_arrow(), duck_ns, ["id"], "duckdb, nanoseconds")


def test_every_publication_of_a_growing_table_reads_right(sqlite_lake, iceberg_clients,
                                                           tmp_path, monkeypatch):
    """Published after every commit, with manifests split at 4 entries and merged from 3 on:
    rewrites, merges and reused manifests of data and of vectors all read right, at every
    snapshot; a data file keeps its first row id from one publication to the next, and the
    live files' row ids never overlap."""
    monkeypatch.setattr(publisher, "MANIFEST_ENTRIES", 4)
    monkeypatch.setattr(publisher, "MERGE_MIN_COUNT", 3)
    users = sqlite_lake.create_table(
        "crm.users", USERS, primary_key=["id"], buckets=3, deletion_vectors=True,
        properties={"compaction.mode": "off"})
    rng = np.random.default_rng(11)
    locations = []
    users.upsert(_users(np.arange(3_000), "a"))
    locations.append(publish(users).metadata_location)
    for round_ in range(6):
        users.upsert(_users(rng.choice(3_500, 400, replace=False), f"r{round_}"))
        if round_ == 3:
            users.delete("id < 200")
        if round_ == 4:
            users.compact(full=True)
        locations.append(publish(users).metadata_location)
    snapshots = [h["snapshot_id"] for h in users.history()]
    last = locations[-1]
    reads = _snapshot_reads(last, snapshots)
    reads += [Read("manifests", locations[2]), Read("manifests", last)]
    got = read_all(iceberg_clients, reads, tmp_path)
    for i, (engine, s) in enumerate((e, s) for e in ENGINES for s in snapshots):
        assert_same_rows(users.scan(snapshot=s).to_arrow(), got[i], ["id"],
                         f"{engine} snapshot {s}")
    before, after = got[-2], got[-1]

    def row_ids(manifests: dict, snapshot: int) -> dict[str, tuple[int, int]]:
        return {e["path"]: (e["first_row_id"], e["records"]) for m in manifests[str(snapshot)]
                for e in m["entries"] if e["content"] == 0 and e["status"] != 2}

    early = int(max(before, key=int))
    assert row_ids(before, early) == row_ids(after, early)
    current = sorted(row_ids(after, users.current_snapshot_id).values())
    assert all(a[0] + a[1] <= b[0] for a, b in itertools.pairwise(current))
