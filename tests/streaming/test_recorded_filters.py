"""A delete of an append table records its filter as text; a change stream parses it back to
find the deleted rows (``-D``). The text must give back exactly the filter that deleted."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pandas as pd
import pyarrow as pa

import arrowlake as al


def deleted_rows(table, expr) -> tuple[list[int], list[tuple[str, int]]]:
    """Delete ``expr``; (ids left in the table, (row kind, id) the stream shows)."""
    stream = table.stream(start="latest", include_row_kind=True, stop_at_latest=True)
    table.delete(expr)
    shown = [(r["_row_kind"], r["id"]) for c in stream for r in c.to_arrow().to_pylist()]
    return sorted(table.to_arrow().column("id").to_pylist()), sorted(shown)


def test_a15_stream_shows_the_row_a_nanosecond_timestamp_deleted(sqlite_lake):
    ts = pd.to_datetime(["2026-01-01 00:00:00.000000001", "2026-01-01 00:00:00.000000002"])
    t = sqlite_lake.from_pandas("s.events", pd.DataFrame({"id": [1, 2], "ts": ts}))
    assert deleted_rows(t, al.col("ts") == ts[0]) == ([2], [("-D", 1)])
    utc = ts.tz_localize("UTC")
    u = sqlite_lake.from_pandas("s.zoned", pd.DataFrame({"id": [1, 2], "ts": utc}))
    assert deleted_rows(u, al.col("ts") == utc[1].tz_convert("Asia/Kolkata")) == (
        [1], [("-D", 2)])


def test_a15_stream_shows_the_row_a_long_duration_deleted(sqlite_lake):
    long = dt.timedelta(days=100_000, microseconds=1)  # past 2**33 s, where floats lose us
    t = sqlite_lake.create_table("s.spans", pa.schema([("id", pa.int64()),
                                                      ("du", pa.duration("us"))]))
    t.append({"id": [1, 2], "du": [long, long + dt.timedelta(microseconds=1)]})
    assert deleted_rows(t, al.col("du") == long) == ([2], [("-D", 1)])
    n = sqlite_lake.create_table("s.nanos", pa.schema([("id", pa.int64()),
                                                      ("du", pa.duration("ns"))]))
    n.append(pa.table({"id": [1, 2], "du": pa.array([1, 2], pa.duration("ns"))}))
    assert deleted_rows(n, al.col("du") < pd.Timedelta(2, unit="ns")) == ([2], [("-D", 1)])


def test_stream_shows_the_rows_of_other_exact_literals(sqlite_lake):
    t = sqlite_lake.create_table("s.mixed", pa.schema([
        ("id", pa.int64()), ("f", pa.float64()), ("p", pa.decimal128(20, 6)), ("s", pa.string()),
    ]))
    t.append({"id": [1, 2, 3], "f": [0.1 + 0.2, 0.3, float("nan")],
              "p": [Decimal("1.000001"), Decimal("1.000002"), None],
              "s": ["it's\n\\", "x", "y"]})
    assert deleted_rows(t, al.col("f") == 0.1 + 0.2) == ([2, 3], [("-D", 1)])
    assert deleted_rows(t, (al.col("p") == Decimal("1.000002")) | (al.col("s") == "nope")) == (
        [3], [("-D", 2)])
