"""Writes in flight are registered, and orphan removal never deletes what they may still commit
(the defects issue's item 1, ../shared/repros/b01)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import CommitConflict, ConsumerInUse, UnsafeOrphanAge
from arrowlake.metastore import inflight
from arrowlake.metastore.inflight import write_id_of
from arrowlake.table import staged
from tests.conftest import stored_paths

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
ZERO = timedelta(0)
#: A file per batch of 2,000 rows: a slow write has several files on disk before it commits.
SMALL_FILES = {"write.target-file-size": "1", "write.row-group-rows": "2000"}


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"k": pa.array(range(start, start + n), pa.int64()),
                     "v": pa.array([f"v{i}" for i in range(start, start + n)])})


def slow_batches(parts: int, pause: float, size: int = 2000):
    for i in range(parts):
        yield rows(i * size, size).to_batches()[0]
        time.sleep(pause)


def data_files(table: al.Table) -> list[str]:
    return sorted(p for p in stored_paths(table) if "/metadata/" not in p)


def remove_orphans_meanwhile(table: al.Table, stop: threading.Event, seen: list) -> None:
    """Orphan removal with no age at all, over and over, as a service set to 0 would."""
    while not stop.is_set():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnsafeOrphanAge)
            seen.extend(table.remove_orphan_files(ZERO, dry_run=False).files)
        time.sleep(0.02)


def test_slow_append_keeps_its_files_from_orphan_removal(lake: al.Lake) -> None:
    """b01: an append streaming for longer than the orphan age, with orphan removal running
    all along, commits every row readable; before, its first files were deleted and the table
    committed references to missing files."""
    table = lake.create_table("m.slow", SCHEMA, properties=SMALL_FILES)
    other = lake.table("m.slow")  # another handle, as a service would have
    stop, deleted = threading.Event(), []
    remover = threading.Thread(target=remove_orphans_meanwhile, args=(other, stop, deleted))
    remover.start()
    try:
        result = table.append(pa.RecordBatchReader.from_batches(
            SCHEMA, slow_batches(5, 0.15)))
    finally:
        stop.set()
        remover.join()
    assert deleted == []
    assert result.added_files >= 5  # one file per batch: several existed before the commit
    assert table.scan().to_arrow().num_rows == 10_000
    assert inflight.CURRENT_WRITE.get() is None
    assert lake.metastore.live_writes() == []  # the registration ended with the write


@pytest.mark.parametrize("deletion_vectors", [True, False])
def test_every_file_a_write_puts_down_names_its_registration(
        sqlite_lake: al.Lake, deletion_vectors: bool) -> None:
    """Every kind of write names all its files after its registration, so none is left for
    the age alone to protect: data files, runs, Puffin vectors, changelogs, compactions."""
    lake = sqlite_lake
    plain = lake.create_table("m.plain", SCHEMA, partition_by=[])
    plain.append(rows(0, 100))
    plain.overwrite(rows(0, 50), filter="k < 60")
    plain.delete("k < 10")
    keyed = lake.create_table(
        "m.keyed", SCHEMA, primary_key=["k"], buckets=2, deletion_vectors=deletion_vectors,
        changelog_producer="lookup",
        properties={"compaction.max-runs": "2"})
    keyed.upsert(rows(0, 20_000))
    evens = rows(0, 20_000).filter(pa.array([i % 2 == 0 for i in range(20_000)]))
    keyed.upsert(evens)  # every other position deleted: vectors too large to keep inline
    if deletion_vectors:
        assert any(p.endswith(".puffin") for p in data_files(keyed))
    for start in range(0, 5000, 1000):
        keyed.upsert(rows(start, 3000))
    keyed.write_changes(pa.table({"k": pa.array([1, 2], pa.int64()),
                                  "v": ["x", None], "op": ["+U", "-D"]}))
    keyed.delete("k < 100")
    keyed.merge(rows(50, 200), on="k").when_matched_update(
        set={"v": "source.v"}).when_not_matched_insert().execute()
    keyed.compact(full=True)
    for table in (plain, keyed):
        files = data_files(table)
        assert files
        unnamed = [p for p in files if write_id_of(p) is None]
        assert unnamed == []
    assert lake.metastore.live_writes() == []


def test_commit_fails_once_its_registration_was_revoked(lake: al.Lake) -> None:
    """A write whose registration ran out (its driver stalled) may have lost its files to
    orphan removal: its commit fails with nothing committed."""
    table = lake.create_table("m.revoked", SCHEMA)
    table.append(rows(0, 10))
    target = staged.write_target(table.state, "test")
    stage = staged.stage(target, rows(100, 10))
    assert stage.files and all(write_id_of(f.path) == target.write_id for f in stage.files)
    # Kept while registered, however old.
    assert table.remove_orphan_files(ZERO, dry_run=False).files == []
    # The lease runs out (the heartbeat stops for as long as the lease lasts) ...
    lake.metastore.renew_writes([target.write_id], -1)
    # ... a dry run does not revoke it, but lists its files as orphans ...
    dry = table.remove_orphan_files(ZERO, dry_run=True)
    assert len(dry.files) == len(stage.files)
    assert [w["write_id"] for w in lake.metastore.live_writes()] == [target.write_id]
    # ... and the real run revokes it and deletes them.
    assert len(table.remove_orphan_files(ZERO, dry_run=False).files) == len(stage.files)
    assert lake.metastore.live_writes() == []
    before = table.current_snapshot_id
    with pytest.raises(CommitConflict, match="no longer registered"):
        staged.commit_staged(table.state, [stage])
    assert table.current_snapshot_id == before
    assert table.scan().to_arrow().num_rows == 10


def test_workers_write_under_the_drivers_registration(sqlite_lake: al.Lake,
                                                      tmp_path: Path) -> None:
    """Executors never touch the metastore: a pickled target carries the write id, not the
    registration, and a worker process's files are named after it."""
    table = sqlite_lake.create_table("m.staged", SCHEMA)
    target = staged.write_target(table.state, "spark")
    copy = pickle.loads(pickle.dumps(target))
    assert copy.write_id == target.write_id and copy._registration is None
    script = textwrap.dedent("""
        import pickle, sys
        import pyarrow as pa
        from arrowlake.table import staged
        target = pickle.loads(open(sys.argv[1], "rb").read())
        stage = staged.stage(target, pa.table({"k": pa.array([1, 2], pa.int64()),
                                               "v": ["a", "b"]}))
        open(sys.argv[2], "wb").write(pickle.dumps(stage))
    """)
    (tmp_path / "target.pkl").write_bytes(pickle.dumps(target))
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "target.pkl"),
                    str(tmp_path / "stage.pkl")], check=True, timeout=120)
    stage = pickle.loads((tmp_path / "stage.pkl").read_bytes())
    assert stage.write_id == target.write_id
    assert table.remove_orphan_files(ZERO, dry_run=False).files == []
    result = staged.commit_staged(table.state, [stage])
    assert result.added_rows == 2
    # The driver's registration lasts until it finishes the target (or drops it).
    assert [w["kind"] for w in sqlite_lake.metastore.live_writes()] == ["spark"]
    target.finish()
    assert sqlite_lake.metastore.live_writes() == []


def test_a_forgotten_registration_ends_when_collected(sqlite_lake: al.Lake) -> None:
    table = sqlite_lake.create_table("m.forgotten", SCHEMA)
    target = staged.write_target(table.state)
    assert len(sqlite_lake.metastore.live_writes()) == 1
    del target
    assert sqlite_lake.metastore.live_writes() == []


def test_heartbeat_keeps_a_long_write_registered(sqlite_lake: al.Lake,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A write lasting many leases stays registered: its process renews it."""
    monkeypatch.setattr(inflight, "LEASE_SECONDS", 0.4)
    table = sqlite_lake.create_table("m.long", SCHEMA, properties=SMALL_FILES)
    stop, deleted = threading.Event(), []
    remover = threading.Thread(target=remove_orphans_meanwhile, args=(table, stop, deleted))
    remover.start()
    try:
        result = table.append(pa.RecordBatchReader.from_batches(
            SCHEMA, slow_batches(8, 0.2)))  # 1.6 s: four leases
    finally:
        stop.set()
        remover.join()
    assert deleted == [] and result.added_rows == 16_000
    assert table.scan().to_arrow().num_rows == 16_000


HOLDER = textwrap.dedent("""
    import sys, time
    import arrowlake as al
    from arrowlake.table import staged
    import pyarrow as pa
    lake = al.connect(sys.argv[1])
    table = lake.table("m.dead")
    target = staged.write_target(table.state, "doomed")
    staged.stage(target, pa.table({"k": pa.array([7], pa.int64()), "v": ["x"]}))
    print(target.write_id, flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("reaped", [True, False])
def test_registration_of_a_killed_writer_is_revoked_at_once(sqlite_lake: al.Lake,
                                                            tmp_path: Path,
                                                            reaped: bool) -> None:
    """A writer SIGKILLed on this machine holds nothing, also while it waits, a zombie, to be
    reaped: its registration is revoked without waiting for its lease (5 minutes)."""
    table = sqlite_lake.create_table("m.dead", SCHEMA)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "lake")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        write_id = proc.stdout.readline().strip()
        assert write_id_of(f"{write_id}-x.parquet") == write_id
        assert table.remove_orphan_files(ZERO, dry_run=False).files == []  # alive: kept
        os.kill(proc.pid, signal.SIGKILL)
        if reaped:
            proc.wait()
        else:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # dead but not reaped: a zombie
                with open(f"/proc/{proc.pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
                time.sleep(0.01)
            else:
                pytest.fail("the killed writer never became a zombie")
        removed = table.remove_orphan_files(ZERO, dry_run=False).files
        assert len(removed) == 1 and write_id_of(removed[0]) == write_id
        assert sqlite_lake.metastore.live_writes() == []
    finally:
        proc.kill()
        proc.wait()


def test_unsafe_orphan_ages_are_warned(sqlite_lake: al.Lake) -> None:
    table = sqlite_lake.create_table("m.ages", SCHEMA)
    with pytest.warns(UnsafeOrphanAge, match="below 1:00:00"):
        table.remove_orphan_files(timedelta(minutes=5))
    with pytest.warns(UnsafeOrphanAge, match="orphan.min-age"):
        table.set_properties(**{"orphan.min-age": "10 min"})
    with pytest.warns(UnsafeOrphanAge):
        sqlite_lake.create_table("m.ages2", SCHEMA, properties={"orphan.min-age": "0"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsafeOrphanAge)
        table.remove_orphan_files(timedelta(hours=1))
        table.set_properties(**{"orphan.min-age": "1h30m"})
    with pytest.raises(al.ValidationError, match="negative"):
        table.remove_orphan_files(timedelta(seconds=-1))


def test_row_ids_are_assigned_once_at_commit(sqlite_lake: al.Lake) -> None:
    """Row lineage: each data file's rows take the next ids at the commit that adds them, so
    every later reading of the metastore agrees on them."""
    table = sqlite_lake.create_table("m.lineage", SCHEMA)
    table.append(rows(0, 10))
    table.append(rows(10, 5))
    table.delete("k < 3")  # rewrites the first file: its 7 rows get new ids
    import sqlalchemy as sa

    from arrowlake.metastore import tables as t
    with sqlite_lake.metastore.engine.connect() as conn:
        files = conn.execute(sa.select(t.files.c.added_snapshot, t.files.c.first_row_id,
                                       t.files.c.row_count).order_by(t.files.c.file_id)).all()
        snaps = conn.execute(sa.select(t.snapshots.c.snapshot_id, t.snapshots.c.first_row_id)
                             .order_by(t.snapshots.c.snapshot_id)).all()
        next_id = conn.execute(sa.select(t.tables.c.next_row_id)).scalar_one()
    assert [tuple(f) for f in files] == [(1, 0, 10), (2, 10, 5), (3, 15, 7)]
    assert [tuple(s) for s in snaps] == [(1, 0), (2, 10), (3, 15)]
    assert next_id == 22


CONSUMER = textwrap.dedent("""
    import sys, time
    import arrowlake as al
    lake = al.connect(sys.argv[1])
    stream = lake.table("m.events").stream(consumer="etl", start="earliest")
    print("holding", flush=True)
    time.sleep(600)
""")


def test_consumer_lease_of_a_killed_unreaped_holder_is_free(sqlite_lake: al.Lake,
                                                             tmp_path: Path) -> None:
    """A stream's process SIGKILLed but not yet reaped by its parent (a zombie) is a dead
    holder: its consumer id is taken over at once (the defects issue's item 6)."""
    table = sqlite_lake.create_table("m.events", SCHEMA)
    table.append(rows(0, 3))
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, str(tmp_path / "lake")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        with pytest.raises(ConsumerInUse):
            table.stream(consumer="etl", start="earliest")
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        else:
            pytest.fail("the killed holder never became a zombie")
        with table.stream(consumer="etl", start="earliest", stop_at_latest=True) as stream:
            assert sum(change.to_arrow().num_rows for change in stream) == 3
    finally:
        proc.kill()
        proc.wait()


def test_a_detached_write_outlives_the_process_that_made_it(sqlite_lake: al.Lake) -> None:
    """A Spark data source write is made in one Python process on the driver and committed in
    another: its registration is held by no process, kept by its lease, which the commit
    extends, and ended by whoever commits."""
    table = sqlite_lake.create_table("m.detached", SCHEMA)
    made = staged.write_target(table.state, "spark", detached_lease=60)
    target = pickle.loads(pickle.dumps(made))
    del made  # the making process lets go of its copy
    [row] = sqlite_lake.metastore.live_writes()
    assert row["pid"] == 0
    stage = staged.stage(target, rows(0, 5))
    assert table.remove_orphan_files(ZERO, dry_run=False).files == []
    sqlite_lake.metastore.renew_writes([target.write_id], 5_000)  # a lease nearly run out
    staged.commit_staged(table.state, [stage])
    [row] = sqlite_lake.metastore.live_writes()
    assert row["expires_at"] - row["started_at"] >= 59_000  # the commit extended it
    target.finish(sqlite_lake.metastore)
    assert sqlite_lake.metastore.live_writes() == []
    # A detached write whose lease ran out is revoked, and its commit fails.
    late = staged.write_target(table.state, "spark", detached_lease=60)
    stage = staged.stage(late, rows(10, 5))
    sqlite_lake.metastore.renew_writes([late.write_id], -1)
    assert len(table.remove_orphan_files(ZERO, dry_run=False).files) == len(stage.files)
    with pytest.raises(CommitConflict):
        staged.commit_staged(table.state, [stage])
    assert table.scan().to_arrow().num_rows == 5
