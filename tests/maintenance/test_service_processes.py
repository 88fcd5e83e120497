"""The maintenance service in its own process, beside writers in others: every snapshot still
holds what a serial writer would have left, runs per bucket stay bounded, expiry keeps what a
live consumer needs, two services never compact one bucket twice, and SIGKILL / SIGTERM of the
service lose nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from tests.conftest import make_lake

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])

WRITER = r"""
import json, random, sys, time, arrowlake as al
uri, warehouse, n, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
lake = al.connect(uri, warehouse=warehouse) if "://" in uri else al.connect(uri)
table = lake.table("m.events")
rng = random.Random(7)
started = time.monotonic()
with open(log, "w") as out:
    for i in range(n):
        ids = rng.sample(range(64), rng.randint(1, 6))
        rows = {"id": ids, "v": [rng.randint(0, 10**6) for _ in ids]}
        result = table.upsert(rows)
        out.write(json.dumps({"snap": result.snapshot_id, "rows": rows,
                              "compaction": result.compaction is not None}) + "\n")
        out.flush()
        time.sleep(0.02)  # a commit every few tens of milliseconds, as a streaming sink
"""


def _where(kind: str, lake: al.Lake, tmp_path: Path) -> list[str]:
    """``--lake`` (and ``--warehouse``) of ``lake`` for another process."""
    if kind == "sqlite":
        return ["--lake", str(tmp_path / "lake")]
    return ["--lake", lake.metastore.engine.url.render_as_string(hide_password=False),
            "--warehouse", lake.warehouse]


def _writer(where: list[str], n: int, log: Path) -> subprocess.Popen[bytes]:
    uri = where[1]
    warehouse = where[3] if len(where) > 2 else ""
    return subprocess.Popen([sys.executable, "-c", WRITER, uri, warehouse, str(n), str(log)],
                            stderr=subprocess.PIPE)


def _service(where: list[str], *args: str, out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as stdout:
        return subprocess.Popen(
            [sys.executable, "-m", "arrowlake.cli.main", *where, "--json", "maintain", *args],
            stdout=stdout, stderr=subprocess.PIPE)


def _actions(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _replay(entries: list[dict]) -> dict[int, dict[int, int]]:
    """The serial model: the rows after each upsert, in snapshot order."""
    state: dict[int, int] = {}
    after: dict[int, dict[int, int]] = {}
    for e in sorted(entries, key=lambda e: e["snap"]):
        state.update(zip(e["rows"]["id"], e["rows"]["v"], strict=True))
        after[e["snap"]] = dict(state)
    return after


def _check_snapshots(table: al.Table, entries: list[dict]) -> list[int]:
    """Every retained snapshot holds the model's rows (a compaction changes none); the ids."""
    after = _replay(entries)
    snaps = table.snapshots()
    kinds = dict(zip(snaps["snapshot_id"].to_pylist(), snaps["kind"].to_pylist(), strict=True))
    writes = {e["snap"] for e in entries}
    assert {s for s, k in kinds.items() if k != "compact"} <= writes
    expected: dict[int, int] | None = None
    for snap in sorted(after):
        if snap < min(kinds):
            expected = after[snap]
    for snap in sorted(kinds):
        expected = after.get(snap, expected)
        got = table.scan(snapshot=snap).to_arrow().to_pylist()
        assert {r["id"]: r["v"] for r in got} == expected, f"snapshot {snap} ({kinds[snap]})"
        assert len(got) == len(expected or {}), f"a key live twice at snapshot {snap}"
    return sorted(kinds)


def _runs_at(table: al.Table, snapshot: int) -> int:
    """The most runs one bucket of the table holds at ``snapshot``."""
    files = table._metastore.live_files(table._record.table_id, snapshot)
    if table._record.deletion_vectors:
        keys = zip(files["bucket"].to_pylist(), files["file_id"].to_pylist(), strict=True)
    else:
        keys = zip(files["bucket"].to_pylist(), files["seq_min"].to_pylist(),
                   files["seq_max"].to_pylist(), strict=True)
    runs: dict[int, set] = {}
    for key in keys:
        runs.setdefault(key[0], set()).add(key[1:])
    return max((len(r) for r in runs.values()), default=0)


def _unreferenced(table: al.Table) -> set[str]:
    """Files under the table's folder that no snapshot references."""
    referenced = {table._storage.join(table.location, p)
                  for p in table._metastore.all_file_paths(table._record.table_id)}
    listed = {f.path for f in table._storage.list_files(table.location)}
    return listed - referenced


def _create(lake: al.Lake, *, vectors: bool = False, buckets: int = 4,
            **props: str) -> al.Table:
    return lake.create_table(
        "m.events", SCHEMA, primary_key=["id"], buckets=buckets, deletion_vectors=vectors,
        properties={"compaction.mode": "deferred", "compaction.max-runs": "4", **props})


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "vectors"), [("sqlite", False), ("sqlite", True),
                                               ("postgres", False)],
                         ids=["sqlite", "sqlite-vectors", "postgres"])
def test_writer_and_service_in_two_processes(kind, vectors, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    table = _create(lake, vectors=vectors, **{"snapshot.retain-last": "3"})
    start = [{"id": list(range(1000, 1032)), "v": [i] * 32} for i in range(6)]
    results = [table.upsert(rows) for rows in start]
    assert all(r.compaction is None for r in results)
    assert table.health().runs_max == 6  # deferred: nothing compacted them
    with table.stream(consumer="reader", stop_at_latest=True) as stream:
        held = next(iter(stream)).snapshot_id  # the full state at snapshot 6
        stream.commit(held)  # it resumes after it, and needs it as its base
    where = _where(kind, lake, tmp_path)
    service = _service(where, "--interval", "0s", out=tmp_path / "service.jsonl")
    deadline = time.monotonic() + 60
    while table.health().runs_max > 4 and time.monotonic() < deadline:
        time.sleep(0.05)  # the service is up once it compacted those
    ready = table.current_snapshot_id
    writer = _writer(where, 60, tmp_path / "writer.jsonl")
    _, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err.decode()
    # The service catches up with the last write.
    deadline = time.monotonic() + 30
    while table.health().runs_max > 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    service.send_signal(signal.SIGTERM)
    _, err = service.communicate(timeout=60)
    assert service.returncode == 0, err.decode()

    entries = [json.loads(line) for line in (tmp_path / "writer.jsonl").read_text().splitlines()]
    assert len(entries) == 60
    assert not any(e["compaction"] for e in entries)  # deferred: no write compacted
    entries += [{"snap": i + 1, "rows": rows} for i, rows in enumerate(start)]
    actions = _actions(tmp_path / "service.jsonl")
    assert not [a for a in actions if a["error"]], actions
    compactions = [a for a in actions if a["action"] == "compact" and not a["dropped"]]
    assert compactions
    # Expiry ran (retain-last 3), and kept every snapshot the consumer needs.
    assert any(a["action"] == "expire" for a in actions)
    snapshots = _check_snapshots(table, entries)
    assert snapshots[0] == held
    assert len(snapshots) > 60
    # 60 commits, and no bucket came near 60 runs while the service ran. With deletion
    # vectors every write here deletes rows of every bucket's files while they are rewritten;
    # the rewrite drops those rows and lands anyway, so the bound is the same.
    assert max(_runs_at(table, s) for s in snapshots if s >= ready) <= 16
    assert table.health().runs_max <= 4
    assert table.health().last_maintenance is not None

    # Once the consumer moves on, what it no longer needs expires; what it needs stays.
    with table.stream(consumer="reader", stop_at_latest=True) as stream:
        moved = next(iter(stream)).snapshot_id  # caught up in one change
        stream.commit(moved)
    run = subprocess.run([sys.executable, "-m", "arrowlake.cli.main", *where, "--json",
                          "maintain", "--once"], capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    kept = _check_snapshots(table, entries)
    assert kept[0] == min(moved, snapshots[-3])  # its base, or the 3 newest
    assert len(kept) < len(snapshots)
    lake.close()


@pytest.mark.slow
def test_two_services_never_compact_the_same_bucket(tmp_path, request):
    lake = make_lake("sqlite", tmp_path, request)
    table = _create(lake, buckets=8)
    where = _where("sqlite", lake, tmp_path)
    services = [_service(where, "--interval", "1h", out=tmp_path / f"service{i}.jsonl")
                for i in range(2)]
    writer = _writer(where, 40, tmp_path / "writer.jsonl")
    _, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err.decode()
    deadline = time.monotonic() + 30
    while table.health().runs_max > 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    for service in services:
        service.send_signal(signal.SIGTERM)
    for service in services:
        _, err = service.communicate(timeout=60)
        assert service.returncode == 0, err.decode()
    logs = [[a for a in _actions(tmp_path / f"service{i}.jsonl") if a["action"] == "compact"]
            for i in range(2)]
    assert logs[0] or logs[1]
    # A compaction that lost its race would be dropped: with leases, none ever is.
    assert not [a for log in logs for a in log if a["dropped"]]
    committed = [a["snapshot_id"] for log in logs for a in log]
    assert len(committed) == len(set(committed))
    snaps = table.snapshots()
    compacts = snaps.filter(pa.compute.equal(snaps["kind"], "compact"))
    assert sorted(compacts["snapshot_id"].to_pylist()) == sorted(committed)
    entries = [json.loads(line) for line in (tmp_path / "writer.jsonl").read_text().splitlines()]
    _check_snapshots(table, entries)
    assert table._metastore.bucket_leases(table._record.table_id) == []
    lake.close()


KILLABLE_ROWS = 200_000


def _big_table(lake: al.Lake) -> tuple[al.Table, dict[int, int]]:
    """A deferred table whose compaction takes a while: 2 buckets of 8 large runs each."""
    table = _create(lake, buckets=2, **{"orphan.min-age": "0 s"})
    expected: dict[int, int] = {}
    for i in range(8):
        ids = pa.array(range(i * 20_000, i * 20_000 + KILLABLE_ROWS), pa.int64())
        table.upsert(pa.table({"id": ids, "v": pa.array([i] * len(ids), pa.int64())}))
        expected.update((k, i) for k in range(i * 20_000, i * 20_000 + KILLABLE_ROWS))
    return table, expected


def _check_rows(table: al.Table, expected: dict[int, int]) -> None:
    rows = table.to_arrow()
    assert rows.num_rows == len(expected)
    got = dict(zip(rows["id"].to_pylist(), rows["v"].to_pylist(), strict=True))
    assert got == expected


@pytest.mark.slow
def test_sigkill_mid_compaction_loses_nothing_and_a_restart_cleans_up(tmp_path, request):
    lake = make_lake("sqlite", tmp_path, request)
    table, expected = _big_table(lake)
    before = table.current_snapshot_id
    where = _where("sqlite", lake, tmp_path)
    # One bucket per chunk: the second waits for the budget, so the service is caught between.
    service = _service(where, "--bytes-per-second", "1K", out=tmp_path / "killed.jsonl")
    left: set[str] = set()
    deadline = time.monotonic() + 60
    while not left and service.poll() is None and time.monotonic() < deadline:
        left = _unreferenced(table)  # a compaction's output, written but not committed yet
    service.send_signal(signal.SIGKILL)
    service.wait(timeout=30)
    assert left, "the service was never caught with a compaction in progress"
    # On a loaded machine the first chunk may commit between the look and the kill; the
    # second waits for the byte budget, so at most that one landed.
    landed = table.current_snapshot_id - before
    assert landed in (0, 1)
    _check_rows(table, expected)
    leases = table._metastore.bucket_leases(table._record.table_id)
    if not landed:
        assert [lease["pid"] for lease in leases] == [service.pid]  # its lease outlived it

    run = subprocess.run([sys.executable, "-m", "arrowlake.cli.main", *where, "--json",
                          "maintain", "--once"], capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    actions = [json.loads(line) for line in run.stdout.decode().splitlines()]
    compacted = {b for a in actions if a["action"] == "compact" for b in a["buckets"]}
    if not landed:
        assert compacted == {0, 1}  # the dead service's lease was taken over at once
        assert any(a["action"] == "orphans" and a["deleted_files"] for a in actions)
    else:
        assert len(compacted) == 1
    assert _unreferenced(table) == set()
    assert table.health().runs_max == 1
    assert table._metastore.bucket_leases(table._record.table_id) == []
    _check_rows(table, expected)
    lake.close()


@pytest.mark.slow
def test_sigterm_lets_the_compaction_in_progress_finish_and_exits_0(tmp_path, request):
    lake = make_lake("sqlite", tmp_path, request)
    table, expected = _big_table(lake)
    where = _where("sqlite", lake, tmp_path)
    service = _service(where, out=tmp_path / "service.jsonl")
    deadline = time.monotonic() + 60
    while not _unreferenced(table) and service.poll() is None and \
            time.monotonic() < deadline:
        pass
    service.send_signal(signal.SIGTERM)  # while a compaction is writing its output
    _, err = service.communicate(timeout=60)
    assert service.returncode == 0, err.decode()
    actions = _actions(tmp_path / "service.jsonl")
    assert [a["action"] for a in actions] == ["compact"], actions
    assert actions[0]["snapshot_id"] == table.current_snapshot_id  # it committed
    assert _unreferenced(table) == set()  # and left nothing behind
    assert table._metastore.bucket_leases(table._record.table_id) == []
    _check_rows(table, expected)
    assert os.path.exists(tmp_path / "lake")
    lake.close()
