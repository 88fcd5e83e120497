"""Concurrent writers in separate processes: every commit lands once, nothing is lost."""

from __future__ import annotations

import json
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
    from arrowlake.table.writes import plain as writes

    original = writes._plan_removal
    calls = {"n": 0}

    def racing(table, snapshot_id, expr):
        calls["n"] += 1
        if calls["n"] == 1:
            other = al.Table(table.catalog, table.record)
            other.append(pa.table({"k": [2, 2, 9]}))  # lands between planning and commit
        return original(table, snapshot_id, expr)

    monkeypatch.setattr(writes, "_plan_removal", racing)
    t.delete("k = 2")
    assert sorted(t.to_arrow()["k"].to_pylist()) == [1, 3, 9]
    assert calls["n"] == 2


PK_WORKER = r"""
import json, random, sys, pyarrow as pa, arrowlake as al
from arrowlake.errors import CommitConflict
uri, warehouse, worker, n, log = (sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                  sys.argv[5])
lake = al.connect(uri, warehouse=warehouse) if "://" in uri else al.connect(uri)
table = lake.table("c.pk")
rng = random.Random(worker)
FILTERS = ["amount < 0", "amount > 15", "ts < 5"]

def rows(count):
    ids = rng.sample(range(8), count)
    return {"id": ids, "amount": [rng.randint(-5, 20) for _ in ids],
            "ts": [rng.randint(0, 30) for _ in ids]}

with open(log, "w") as out:
    for i in range(n):
        op = rng.choice(["upsert", "upsert", "delete", "merge", "merge", "compact"])
        try:
            if op == "upsert":
                data = rows(rng.randint(1, 3))
                entry = {"snap": table.upsert(data).snapshot_id, "rows": data}
            elif op == "delete":
                where = rng.choice(FILTERS)
                res = table.delete(where)
                entry = {"snap": res.snapshot_id, "where": where, "removed": res.removed_rows}
            elif op == "merge":
                data = rows(rng.randint(1, 3))
                res = (table.merge(pa.table(data), on="id")
                       .when_matched_update(where="source.ts > target.ts")
                       .when_not_matched_insert().execute())
                entry = {"snap": res.snapshot_id, "rows": data, "inserted": res.inserted,
                         "updated": res.updated, "unchanged": res.unchanged}
            else:
                entry = {"snap": table.compact(full=rng.random() < 0.5).snapshot_id}
        except CommitConflict:
            entry = {"snap": None, "conflict": True}  # gave up: the table is unchanged
        out.write(json.dumps({"op": op, "worker": worker, **entry}) + "\n")
        out.flush()
"""


def _matches(row: dict, where: str) -> bool:
    column, op, value = where.split()
    return row[column] < int(value) if op == "<" else row[column] > int(value)


def _replay(entries: list[dict]) -> dict[int, dict[int, dict]]:
    """The serial model: apply each committed write in snapshot order; the state after each
    snapshot. A delete or merge must have decided exactly as on the state before its commit."""
    state: dict[int, dict] = {}
    after: dict[int, dict[int, dict]] = {}
    for e in sorted(entries, key=lambda e: e["snap"]):
        if e["op"] == "upsert":
            for k, a, ts in zip(e["rows"]["id"], e["rows"]["amount"], e["rows"]["ts"],
                                strict=True):
                state[k] = {"id": k, "amount": a, "ts": ts}
        elif e["op"] == "delete":
            gone = [k for k, r in state.items() if _matches(r, e["where"])]
            assert e["removed"] == len(gone), f"delete at snapshot {e['snap']}: {e}"
            for k in gone:
                del state[k]
        elif e["op"] == "merge":
            inserted = updated = 0
            for k, a, ts in zip(e["rows"]["id"], e["rows"]["amount"], e["rows"]["ts"],
                                strict=True):
                if k not in state:
                    inserted += 1
                elif ts > state[k]["ts"]:
                    updated += 1
                else:
                    continue
                state[k] = {"id": k, "amount": a, "ts": ts}
            assert (e["inserted"], e["updated"]) == (inserted, updated), \
                f"merge at snapshot {e['snap']} decided on a stale state: {e}"
        after[e["snap"]] = {k: dict(v) for k, v in state.items()}
    return after


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("vectors", [False, True], ids=["merge-on-read", "deletion-vectors"])
def test_racing_pk_deletes_merges_and_compactions_match_a_serial_model(kind, vectors, tmp_path,
                                                                       request):
    """Processes upsert, delete by a filter, merge with a source-vs-target condition and compact
    the same few keys at once. Replaying the committed writes in snapshot order through a plain
    model must give every snapshot's rows, and each delete/merge must have decided as it would
    have on the rows just before its commit. With deletion vectors, no key is ever live twice."""
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table(
        "c.pk", pa.schema([("id", pa.int64()), ("amount", pa.int64()), ("ts", pa.int64())]),
        primary_key=["id"], buckets=2, properties={"compaction.max-runs": "3"},
        deletion_vectors=vectors)
    if kind == "sqlite":
        uri, warehouse = str(tmp_path / "lake"), ""
    else:
        uri, warehouse = str(lake.metastore.engine.url.render_as_string(hide_password=False)), \
            lake.warehouse
    logs = [tmp_path / f"worker{w}.jsonl" for w in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", PK_WORKER, uri, warehouse, str(w), "26",
                               str(logs[w])], stderr=subprocess.PIPE) for w in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()
    entries = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    assert len(entries) == 78
    writes = [e for e in entries if e["snap"] is not None and e["op"] != "compact"]
    snaps = table.snapshots()
    kinds = dict(zip(snaps["snapshot_id"].to_pylist(), snaps["kind"].to_pylist(), strict=True))
    # Every snapshot is a logged write or a compaction; no write landed twice or unlogged.
    assert sorted(e["snap"] for e in writes) == sorted(
        s for s, k in kinds.items() if k != "compact")
    assert all(kinds[e["snap"]] == e["op"] for e in writes)
    assert sum(e["op"] in ("delete", "merge") for e in writes) >= 10  # the races happened
    after = _replay(writes)
    expected: dict[int, dict] = {}
    for snap in sorted(kinds):
        expected = after.get(snap, expected)  # a compaction changes no row
        got = table.scan(snapshot=snap).to_arrow().to_pylist()
        assert {r["id"]: r for r in got} == expected, f"snapshot {snap} ({kinds[snap]})"
        assert len(got) == len(expected), f"a key live twice at snapshot {snap}"
        assert table.scan(snapshot=snap).count() == len(expected)
    lake.close()
