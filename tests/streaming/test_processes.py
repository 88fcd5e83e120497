"""Streams against writers in other processes, and consumers killed with SIGKILL."""

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

from arrowlake.errors import ConsumerInUse
from tests.conftest import make_lake

WRITER = r"""
import sys, time, pyarrow as pa, arrowlake as al
uri, warehouse, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
lake = al.connect(uri, warehouse=warehouse) if warehouse else al.connect(uri)
table = lake.table("s.events")
for i in range(count):
    table.append({"n": pa.array([i, i], pa.int64())})
    time.sleep(0.01)
"""

CONSUMER = r"""
import sys, json, os, time, arrowlake as al
uri, warehouse, log, stop_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lake = al.connect(uri, warehouse=warehouse) if warehouse else al.connect(uri)
table = lake.table("s.events")
with table.stream(consumer="worker", start="earliest", poll_interval=0.05,
                  catch_up_threshold=None) as stream, open(log, "a") as out:
    for change in stream:
        values = sorted(change.to_arrow().column("n").to_pylist())
        time.sleep(0.05)  # slow work: the kill lands mid-stream
        # Processed, then committed: a kill between the two repeats this change, never skips it.
        out.write(json.dumps({"snapshot": change.snapshot_id, "n": values}) + "\n")
        out.flush()
        os.fsync(out.fileno())
        stream.commit(change.snapshot_id)
        if change.snapshot_id >= stop_at:
            break
"""


def _uri(kind: str, lake, tmp_path: Path) -> tuple[str, str]:
    if kind == "sqlite":
        return str(tmp_path / "lake"), ""
    return lake.metastore.engine.url.render_as_string(hide_password=False), lake.warehouse


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_writer_process_commits_while_consumer_reads_every_change_once_in_order(
        kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table("s.events", pa.schema([("n", pa.int64())]))
    uri, warehouse = _uri(kind, lake, tmp_path)
    count = 40
    writer = subprocess.Popen([sys.executable, "-c", WRITER, uri, warehouse, str(count)],
                              env=_env())
    seen: list[tuple[int, list[int]]] = []
    deadline = time.time() + 120
    with table.stream(start="earliest", poll_interval=0.02, catch_up_threshold=None) as stream:
        for change in stream:
            seen.append((change.snapshot_id, change.to_arrow().column("n").to_pylist()))
            if len(seen) == count or time.time() > deadline:
                break
    assert writer.wait(60) == 0
    assert [s for s, _ in seen] == list(range(1, count + 1))
    assert [n for _, n in seen] == [[i, i] for i in range(count)]
    lake.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_consumer_killed_with_sigkill_resumes_at_its_last_commit(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table("s.events", pa.schema([("n", pa.int64())]))
    count = 30
    for i in range(count):
        table.append({"n": pa.array([i, i], pa.int64())})
    uri, warehouse = _uri(kind, lake, tmp_path)
    log = tmp_path / "log.jsonl"
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, uri, warehouse, str(log),
                                 str(count)], env=_env())
    deadline = time.time() + 120
    while not log.exists() or len(log.read_text().splitlines()) < 10:
        assert consumer.poll() is None, "the consumer ended early"
        assert time.time() < deadline
        time.sleep(0.005)
    os.kill(consumer.pid, signal.SIGKILL)
    consumer.wait(30)
    first_run = [json.loads(line) for line in log.read_text().splitlines()]
    committed = table.consumers().column("next_snapshot").to_pylist()[0]
    # Everything up to the last commit was processed; at most the change in flight was not
    # committed yet.
    assert committed - 1 in (first_run[-1]["snapshot"], first_run[-1]["snapshot"] - 1)

    restart = subprocess.run([sys.executable, "-c", CONSUMER, uri, warehouse, str(log),
                              str(count)], env=_env(), timeout=120)
    assert restart.returncode == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    second_run = records[len(first_run):]
    assert second_run[0]["snapshot"] == committed  # resumed right after the last commit
    snapshots = [r["snapshot"] for r in records]
    assert sorted(set(snapshots)) == list(range(1, count + 1))  # nothing missed
    assert len(snapshots) - len(set(snapshots)) <= 1  # at most the uncommitted one repeated
    for r in records:
        assert r["n"] == [r["snapshot"] - 1] * 2
    assert table.consumers().column("next_snapshot").to_pylist() == [count + 1]
    lake.close()


HOLDER = r"""
import sys, time, arrowlake as al, arrowlake.streaming.leases as leases
uri, warehouse, ready, host, lease = sys.argv[1:6]
if host:
    leases._HOST = host  # as if on another machine: its process id cannot be checked from here
leases.LEASE_SECONDS = float(lease)
lake = al.connect(uri, warehouse=warehouse) if warehouse else al.connect(uri)
table = lake.table("s.events")
stream = table.stream(consumer="shared", start="earliest", poll_interval=0.05,
                      catch_up_threshold=None)
for change in stream:
    stream.commit(change.snapshot_id)
    if change.snapshot_id == table.current_snapshot_id:
        open(ready, "w").write("holding")  # caught up; it goes on following the table
"""


def _holder(uri: str, warehouse: str, ready: Path, host: str = "", lease: float = 60
            ) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLDER, uri, warehouse, str(ready), host,
                             str(lease)], env=_env())


def _wait_for(ready: Path, process: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while not ready.exists():
        assert process.poll() is None, "the holder ended early"
        assert time.time() < deadline
        time.sleep(0.01)


def test_18c_a_second_process_sharing_a_consumer_id_is_refused_until_the_first_is_gone(
        tmp_path, request):
    kind = "sqlite"
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table("s.events", pa.schema([("n", pa.int64())]))
    for i in range(2):
        table.append({"n": [i]})
    uri, warehouse = _uri(kind, lake, tmp_path)
    first = _holder(uri, warehouse, tmp_path / "first")
    _wait_for(tmp_path / "first", first)
    # Another process is refused while the holder lives: it would get every change too and
    # move the recorded progress back.
    with pytest.raises(ConsumerInUse, match=f"another open stream \\(process {first.pid} "):
        table.stream(consumer="shared")
    assert table.consumers().column("next_snapshot").to_pylist() == [3]

    # A holder killed on this machine gives the id up at once: its process is gone.
    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    table.append({"n": [2]})
    with table.stream(consumer="shared", stop_at_latest=True) as stream:
        assert [c.snapshot_id for c in stream] == [3]  # resumes after the last commit
        stream.commit()

    # One on another machine (its process cannot be checked): once its lease expired.
    remote = _holder(uri, warehouse, tmp_path / "remote", host="elsewhere", lease=1.5)
    table.append({"n": [3]})
    _wait_for(tmp_path / "remote", remote)  # (it read snapshot 4 and is holding)
    os.kill(remote.pid, signal.SIGKILL)
    remote.wait(30)
    killed = time.monotonic()
    with pytest.raises(ConsumerInUse, match="until its lease expires"):
        table.stream(consumer="shared")
    while True:
        try:
            taken = table.stream(consumer="shared", stop_at_latest=True)
            break
        except ConsumerInUse:
            assert time.monotonic() - killed < 30
            time.sleep(0.1)
    assert time.monotonic() - killed >= 1.0
    with taken:
        assert [c.snapshot_id for c in taken] == []
    assert table.consumers().column("next_snapshot").to_pylist() == [5]
    lake.close()
