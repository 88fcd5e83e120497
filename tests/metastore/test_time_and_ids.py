"""Issue 20, items 10 (a05) and 15 (a13): a naive datetime is local time wherever a time is
taken, and a snapshot id out of the metastore's 64-bit range is a snapshot that does not
exist, not a bare OverflowError."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import arrowlake as al
import arrowlake.flight as alf
from arrowlake.errors import SnapshotNotFound, ValidationError


@pytest.fixture
def east_of_utc(monkeypatch):
    """Local time two hours ahead of UTC (no daylight saving), restored afterwards."""
    monkeypatch.setenv("TZ", "Etc/GMT-2")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _three_snapshots(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    time.sleep(0.05)
    since = datetime.now()  # naive local time, between snapshots 1 and 2
    time.sleep(0.05)
    t.append({"id": [2]})
    t.append({"id": [3]})
    return lake, t, since


def test_a05_naive_datetimes_are_local_time(east_of_utc, tmp_path):
    lake, t, since = _three_snapshots(tmp_path)
    assert since.tzinfo is None
    assert t.scan(as_of=since).to_arrow().column("id").to_pylist() == [1]
    changes = [c.snapshot_id for c in t.stream(start=since, stop_at_latest=True)]
    assert changes == [2, 3]
    # The same instant given with its zone reads the same snapshot.
    aware = since.astimezone(UTC)
    assert t.scan(as_of=aware).to_arrow().column("id").to_pylist() == [1]
    # older_than: snapshots committed before a naive local moment (snapshot 1 only; the
    # current one is always kept)
    expired = t.expire_snapshots(older_than=since, retain_last=1).expired_snapshots
    assert expired == [1]
    lake.close()


def test_a05_a_naive_time_east_of_utc_is_not_taken_as_the_future(east_of_utc, tmp_path):
    """Taken as UTC, ``now() - 1 s`` two hours east of UTC is two hours ahead: the stream
    would start after every commit and silently skip them."""
    lake, t, _ = _three_snapshots(tmp_path)
    recent = datetime.now() - timedelta(seconds=60)
    assert [c.snapshot_id for c in t.stream(start=recent, stop_at_latest=True)] == [1, 2, 3]
    lake.close()


def test_a05_a_time_of_another_type_is_a_validation_error(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    with pytest.raises(ValidationError, match="as_of"):
        t.scan(as_of="2026-01-01")  # type: ignore[arg-type]
    lake.close()


BIG = 2**63


def test_a13_snapshot_ids_past_int64_do_not_exist(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    for bad in (BIG, -BIG - 1, 10**30):
        with pytest.raises(SnapshotNotFound, match="64-bit"):
            t.scan(snapshot=bad)
        with pytest.raises(SnapshotNotFound):
            t.stream(start=bad)
        with pytest.raises(SnapshotNotFound):
            t.create_tag("x", snapshot=bad)
    with pytest.raises(SnapshotNotFound, match="never committed"):
        t.scan(snapshot=BIG - 1)
    with pytest.raises(ValidationError, match="integer"):
        t.scan(snapshot="1")  # type: ignore[arg-type]
    assert t.scan(snapshot=1).count() == 1
    lake.close()


def test_a13_flight_answers_snapshot_not_found_past_int64(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    server = alf.server(lake, port=0)
    try:
        client = fl.connect(f"grpc://127.0.0.1:{server.port}")
        for snap in (BIG, BIG - 1):
            command = json.dumps({"table": "s.t", "snapshot": snap}).encode()
            with pytest.raises(pa.ArrowKeyError, match="SnapshotNotFound"):  # NOT_FOUND
                client.get_flight_info(fl.FlightDescriptor.for_command(command))
        client.close()
    finally:
        server.shutdown()
        lake.close()
