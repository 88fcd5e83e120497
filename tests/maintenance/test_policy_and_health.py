"""compaction.mode and the maintenance properties, Table.health(), Lake.maintain(once=True) and
the bucket leases, in one process (the service's own processes: test_service_processes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import ValidationError
from arrowlake.metastore.streams import LeaseHolder
from arrowlake.streaming import leases
from tests.conftest import METASTORES, make_lake, put_file

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])


@pytest.fixture(params=METASTORES)
def lake(request: pytest.FixtureRequest, tmp_path):
    """SQLite and PostgreSQL (the metastore is what differs here; files stay on local disk)."""
    lake = make_lake(request.param, tmp_path, request)
    yield lake
    lake.close()


def _table(lake: al.Lake, name: str = "m.t", *, mode: str | None = "deferred",
           vectors: bool = False, **props: str) -> al.Table:
    properties = {"compaction.max-runs": "3", **props}
    if mode is not None:
        properties["compaction.mode"] = mode
    return lake.create_table(name, SCHEMA, primary_key=["id"], buckets=2,
                             deletion_vectors=vectors, properties=properties)


def _upserts(table: al.Table, n: int) -> list[al.WriteResult]:
    return [table.upsert({"id": list(range(16)), "v": [i] * 16}) for i in range(n)]


@pytest.mark.parametrize("prop", ["compaction.mode", "snapshot.retain-last",
                                  "snapshot.max-age", "orphan.min-age"])
def test_a_malformed_maintenance_property_is_refused_naming_it(sqlite_lake, prop):
    lake = sqlite_lake
    bad = {"compaction.mode": "later", "snapshot.retain-last": "0",
           "snapshot.max-age": "a week", "orphan.min-age": "-1 d"}[prop]
    with pytest.raises(ValidationError, match=prop.replace(".", r"\.")):
        lake.create_table("m.bad", SCHEMA, primary_key=["id"], properties={prop: bad})
    assert not lake.table_exists("m.bad")
    table = _table(lake)
    with pytest.raises(ValidationError, match=prop.replace(".", r"\.")) as info:
        table.set_properties(**{prop: bad})
    if prop == "compaction.mode":
        assert "inline, deferred, off" in str(info.value)
    assert prop not in table.properties or table.properties[prop] != bad


@pytest.mark.parametrize("vectors", [False, True], ids=["merge-on-read", "deletion-vectors"])
@pytest.mark.parametrize("mode", ["deferred", "off", "inline", None])
def test_only_inline_writes_compact_and_compact_works_in_every_mode(sqlite_lake, mode,
                                                                    vectors):
    table = _table(sqlite_lake, mode=mode, vectors=vectors)
    results = _upserts(table, 6)
    if mode in ("inline", None):  # the default for tables without the property
        assert any(r.compaction is not None for r in results)
        assert table.health().runs_max <= 4
    else:
        assert all(r.compaction is None for r in results)
        assert table.health().runs_max == 6
    assert table.compact(full=True).snapshot_id is not None or table.health().runs_max == 1
    assert table.health().runs_max == 1
    assert sorted(table.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": i, "v": 5} for i in range(16)]


def test_maintain_once_compacts_deferred_tables_only_and_records_it(sqlite_lake):
    deferred, off = _table(sqlite_lake, "m.d"), _table(sqlite_lake, "m.off", mode="off")
    _upserts(deferred, 6)
    _upserts(off, 6)
    seen: list[al.MaintenanceAction] = []
    actions = sqlite_lake.maintain(on_action=seen.append)
    assert actions == seen
    assert [(a.table, a.action) for a in actions] == [("m.d", "compact")]
    assert actions[0].buckets == [0, 1] and actions[0].snapshot_id is not None
    assert deferred.health().runs_max <= 3
    assert off.health().runs_max == 6
    last = deferred.health().last_maintenance
    assert last is not None and last.action == "compact"
    assert last.detail["snapshot_id"] == actions[0].snapshot_id
    assert off.health().last_maintenance is None
    assert sqlite_lake.maintain() == []  # nothing left to do
    assert sqlite_lake.maintain(["m.off"]) == []


def test_maintain_expires_by_policy_and_keeps_what_a_consumer_needs(lake):
    table = _table(lake, **{"snapshot.retain-last": "2"})
    _upserts(table, 3)
    with table.stream(consumer="c", stop_at_latest=True) as stream:
        held = next(iter(stream)).snapshot_id  # 3: resumes at 4, needs 3 as its base
        stream.commit(held)
    _upserts(table, 3)  # snapshots 4-6
    actions = lake.maintain()
    expire = [a for a in actions if a.action == "expire"]
    assert expire and expire[0].expired_snapshots == 2  # 1 and 2
    assert table.snapshots()["snapshot_id"].to_pylist()[0] == held
    plain = lake.create_table("m.plain", pa.schema([("x", pa.int64())]),
                              properties={"snapshot.max-age": "1 s"})
    for i in range(3):
        plain.append({"x": [i]})
    assert not [a for a in lake.maintain(["m.plain"]) if a.action == "expire"]
    time.sleep(1.1)
    [action] = [a for a in lake.maintain(["m.plain"]) if a.action == "expire"]
    assert action.expired_snapshots == 2  # the current one stays
    assert sorted(plain.to_arrow()["x"].to_pylist()) == [0, 1, 2]


def test_a_table_without_a_policy_keeps_its_history(sqlite_lake):
    table = _table(sqlite_lake)
    _upserts(table, 5)
    sqlite_lake.maintain()
    assert table.snapshots().num_rows == 6  # five writes and the service's compaction


def test_maintain_removes_orphans_older_than_the_tables_min_age(sqlite_lake):
    table = _table(sqlite_lake, **{"orphan.min-age": "1 h"})
    _upserts(table, 1)
    old, new = f"{table.location}/data/old.parquet", f"{table.location}/data/new.parquet"
    put_file(table, old, b"x" * 10)
    put_file(table, new, b"y" * 10)
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    [action] = [a for a in sqlite_lake.maintain() if a.action == "orphans"]
    assert (action.deleted_files, action.deleted_bytes) == (1, 10)
    assert not os.path.exists(old) and os.path.exists(new)
    assert table.count() == 16


def test_health_reports_files_runs_deletes_snapshots_and_consumer_lag(lake):
    table = _table(lake, vectors=True)
    _upserts(table, 4)
    with table.stream(consumer="slow", stop_at_latest=True) as stream:
        stream.commit(next(iter(stream)).snapshot_id)  # 4: caught up
    _upserts(table, 2)
    health = table.health()
    assert isinstance(health, al.TableHealth)
    files = table.files()
    assert (health.files, health.bytes) == (files.num_rows,
                                            sum(files["file_size"].to_pylist()))
    assert health.rows == 16 and health.buckets == 2
    assert health.runs_max == 6 and health.runs_mean == 6.0
    assert health.deleted_fraction == pytest.approx(80 / 96)  # 5 of 6 versions replaced
    assert health.small_files == health.files
    assert health.snapshots == 6 and health.compaction_mode == "deferred"
    assert health.oldest_snapshot_age_seconds >= health.newest_snapshot_age_seconds >= 0
    [lag] = health.consumers
    assert (lag.consumer, lag.next_snapshot, lag.snapshots_behind) == ("slow", 5, 2)
    assert lag.lag_seconds > 0
    value = health.to_dict()
    assert value["consumers"][0]["consumer"] == "slow" and value["maintenance"] == []
    plain = lake.create_table("m.plain", pa.schema([("x", pa.int64())]))
    assert plain.health().snapshots == 0 and plain.health().deleted_fraction is None
    plain.append({"x": [1]})
    plain.append({"x": [2]})
    # Tables without a key: files per partition.
    assert (plain.health().runs_max, plain.health().compaction_mode) == (2, None)


def _holder(pid: int, host: str = leases.HOST) -> LeaseHolder:
    return LeaseHolder(f"holder-{pid}-{time.monotonic_ns()}", host, pid)


def test_bucket_leases_are_taken_over_only_from_a_dead_or_expired_holder(lake):
    table = _table(lake)
    store, tid = lake.metastore, table._record.table_id
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        mine = _holder(os.getpid())
        assert store.acquire_bucket_leases(tid, [0], _holder(alive.pid), 60_000,
                                           leases.holder_alive) == [0]
        assert store.acquire_bucket_leases(tid, [1], _holder(dead.pid), 60_000,
                                           leases.holder_alive) == [1]
        # The living holder keeps bucket 0; the dead one's bucket 1 is taken over at once.
        assert store.acquire_bucket_leases(tid, [0, 1], mine, 60_000,
                                           leases.holder_alive) == [1]
        # A holder elsewhere counts as alive until its lease expires. The lease is long
        # enough that a loaded machine cannot let it run out between the two calls (a 50 ms
        # lease once did, on PostgreSQL during the full test run).
        remote = _holder(1, host="another machine")
        lease_s = 2.0
        taken_at = time.monotonic()
        assert store.acquire_bucket_leases(tid, [2], remote, int(lease_s * 1000),
                                           leases.holder_alive) == [2]
        assert store.acquire_bucket_leases(tid, [2], mine, 60_000, leases.holder_alive) == []
        time.sleep(max(0.0, taken_at + lease_s + 0.1 - time.monotonic()))
        assert store.acquire_bucket_leases(tid, [2], mine, 60_000, leases.holder_alive) == [2]
        assert store.renew_bucket_leases(mine, 60_000) == 2
        store.release_bucket_leases(mine, tid, [1])
        assert [r["bucket"] for r in store.bucket_leases(tid)] == [0, 2]
        assert table.health().bucket_leases == 2
    finally:
        alive.kill()
        alive.wait()


def test_maintain_arguments_are_checked(sqlite_lake):
    with pytest.raises(ValidationError, match="max_concurrent"):
        sqlite_lake.maintain(max_concurrent=0)
    with pytest.raises(ValidationError, match="bytes_per_second"):
        sqlite_lake.maintain(bytes_per_second=0)
    with pytest.raises(al.errors.TableNotFound):
        sqlite_lake.maintain(["m.missing"])


def test_the_bytes_per_second_budget_spaces_compactions_out(sqlite_lake):
    tables = [_table(sqlite_lake, f"m.t{i}") for i in range(2)]
    for table in tables:
        _upserts(table, 5)
    size = sum(t.health().bytes for t in tables)
    started = time.monotonic()
    actions = sqlite_lake.maintain(bytes_per_second=size)  # about 1 s of work for both
    took = time.monotonic() - started
    compacts = [a for a in actions if a.action == "compact"]
    assert len(compacts) == 2
    # The second compaction waited for the first one's bytes to fit the budget.
    assert took >= (compacts[0].read_bytes + compacts[0].written_bytes) / size * 0.9
    assert timedelta(seconds=took) < timedelta(seconds=30)
