"""Item 7 of the defects issue: ``as_of`` answers with the snapshot current at that time, or
SnapshotNotFound when it expired, never an older (tagged) snapshot."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pyarrow as pa
import pytest

import arrowlake.metastore.store as store
from arrowlake.errors import SnapshotNotFound
from tests.conftest import METASTORES, make_lake


def _moment() -> datetime:
    time.sleep(0.02)
    when = datetime.now(UTC)
    time.sleep(0.02)
    return when


def _ids(table, **at) -> list[int]:
    return sorted(table.scan(**at).to_arrow().column("id").to_pylist())


@pytest.mark.parametrize("kind", METASTORES)
def test_item7_as_of_an_expired_snapshot_raises_instead_of_an_older_tagged_one(
        kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    at_1 = _moment()
    t.create_tag("v1")
    t.append({"id": [2]})
    at_2 = _moment()
    t.append({"id": [3]})
    at_3 = _moment()
    assert _ids(t, as_of=at_2) == [1, 2]
    expired = t.expire_snapshots().expired_snapshots
    assert expired == [2]
    assert _ids(t, as_of=at_1) == [1]  # the tagged snapshot was current then
    with pytest.raises(SnapshotNotFound, match="expired"):
        t.scan(as_of=at_2)
    with pytest.raises(SnapshotNotFound):
        t.scan(snapshot=2)
    assert _ids(t, as_of=at_3) == [1, 2, 3]
    assert _ids(t, tag="v1") == [1]
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item7_as_of_stays_exact_when_a_writers_clock_runs_behind(kind, tmp_path, request,
                                                                   monkeypatch):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    at_1 = _moment()
    t.append({"id": [2]})
    real_now = store.now_ms
    monkeypatch.setattr(store, "now_ms", lambda: real_now() - 60_000)  # a minute behind
    t.append({"id": [3]})
    monkeypatch.setattr(store, "now_ms", real_now)
    committed = t.snapshots().column("committed_at").to_pylist()
    assert committed == sorted(committed)  # snapshot 3 is not recorded before snapshot 1
    assert _ids(t, as_of=at_1) == [1]
    assert t.expire_snapshots(retain_last=1).expired_snapshots == [1, 2]
    with pytest.raises(SnapshotNotFound):
        t.scan(as_of=at_1)
    lake.close()
