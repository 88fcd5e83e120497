"""Concurrent writers in separate processes: every commit lands once, nothing is lost."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

import arrowlake as al
from tests.conftest import make_lake

WORKER = r"""
import sys, pyarrow as pa, arrowlake as al
uri, warehouse, worker, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lake = al.connect(uri, warehouse=warehouse) if "://" in uri else al.connect(uri)
table = lake.table("c.events")
for i in range(n):
    table.append(pa.table({"worker": pa.array([worker], pa.int32()),
                           "i": pa.array([i], pa.int32())}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_four_processes_append_25_times_each(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table("c.events", pa.schema([("worker", pa.int32()), ("i", pa.int32())]))
    if kind == "sqlite":
        uri, warehouse = str(tmp_path / "lake"), ""
    else:
        uri, warehouse = str(lake.metastore.engine.url.render_as_string(hide_password=False)), \
            lake.warehouse
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, uri, warehouse, str(w), "25"],
                              stderr=subprocess.PIPE) for w in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()
    snaps = table.snapshots()
    assert snaps.num_rows == 100
    assert snaps["snapshot_id"].to_pylist() == list(range(1, 101))
    parents = snaps["parent_id"].to_pylist()
    assert parents == [None, *range(1, 100)]  # a single linear history
    rows = table.to_arrow()
    assert rows.num_rows == 100
    pairs = {(r["worker"], r["i"]) for r in rows.to_pylist()}
    assert pairs == {(w, i) for w in range(4) for i in range(25)}
    assert snaps["total_rows"].to_pylist()[-1] == 100
    lake.close()


def test_overwrite_conflicts_with_concurrent_delete_of_its_files(lake):
    t = lake.create_table("c.t", pa.schema([("k", pa.int64()), ("v", pa.int64())]))
    t.append(pa.table({"k": [1, 2, 3], "v": [1, 2, 3]}))
    # A commit that removes files another commit removed meanwhile must fail, not double-apply.
    from arrowlake.errors import CommitConflict
    from arrowlake.metastore.store import SnapshotChange

    file_ids = t.files()["file_id"].to_pylist()
    base = t.current_snapshot_id
    t.delete("k = 2")  # rewrites the only file
    with pytest.raises(CommitConflict, match="removed"):
        lake.metastore.commit(t._record.table_id, base, SnapshotChange(
            kind="overwrite", schema_id=0, remove=file_ids, removed_rows=3))
    assert sorted(t.to_arrow()["k"].to_pylist()) == [1, 3]


def test_delete_replans_after_a_concurrent_append(lake, monkeypatch):
    """A delete whose snapshot moved on re-plans on the new one and still deletes everything."""
    t = lake.create_table("c.d", pa.schema([("k", pa.int64())]))
    t.append(pa.table({"k": [1, 2, 3]}))
    from arrowlake.table import writes

    original = writes._plan_removal
    calls = {"n": 0}

    def racing(table, snapshot_id, expr):
        calls["n"] += 1
        if calls["n"] == 1:
            other = al.Table(table._lake, table._record)
            other.append(pa.table({"k": [2, 2, 9]}))  # lands between planning and commit
        return original(table, snapshot_id, expr)

    monkeypatch.setattr(writes, "_plan_removal", racing)
    t.delete("k = 2")
    assert sorted(t.to_arrow()["k"].to_pylist()) == [1, 3, 9]
    assert calls["n"] == 2
