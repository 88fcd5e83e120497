"""Streams behind many snapshots (files fetched per window), and waking SQLite streams on
commits of other processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.metastore import signals
from arrowlake.streaming import stream as stream_mod
from tests.conftest import METASTORES, make_lake, wake_delays

KEYED = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())])
PLAIN = pa.schema([("id", pa.int64()), ("v", pa.string())])


def _rows(change: al.Change, key: str) -> list[dict]:
    return sorted(change.to_arrow().to_pylist(), key=lambda r: (r[key], r["_row_kind"]))


def _commit_mixed(keyed: al.Table, plain: al.Table, step: int) -> None:
    keyed.upsert({"k": [step % 7, 100 + step], "v": [f"u{step}", f"n{step}"]})
    plain.append({"id": [step], "v": [f"a{step}"]})
    if step % 4 == 3:
        keyed.delete(f"k = {step % 7}")
        plain.delete(f"id = {step - 1}")
    if step % 6 == 5:
        plain.overwrite({"id": [1000 + step], "v": ["o"]}, f"id >= {step - 2}")


@pytest.mark.parametrize("metastore", METASTORES)
@pytest.mark.parametrize("batch_files", [1, 5, 20_000])
def test_stream_behind_many_snapshots_yields_each_snapshots_exact_change(
        metastore, batch_files, tmp_path, request, monkeypatch):
    lake = make_lake(metastore, tmp_path, request)
    keyed = lake.create_table("s.kv", KEYED, primary_key=["k"], buckets=2)
    plain = lake.create_table("s.plain", PLAIN)
    live = [t.stream(start="latest", include_row_kind=True, stop_at_latest=True,
                     catch_up_threshold=None) for t in (keyed, plain)]
    expected: list[list[tuple[int, str, list[dict]]]] = [[], []]
    for step in range(24):
        _commit_mixed(keyed, plain, step)
        for i, (s, key) in enumerate(zip(live, ("k", "id"), strict=True)):
            # One snapshot behind at most: planned alone, as before batching.
            expected[i] += [(c.snapshot_id, c.kind, _rows(c, key)) for c in s]
    monkeypatch.setattr(stream_mod, "_BATCH_FILES", batch_files)
    for i, (t, key) in enumerate(((keyed, "k"), (plain, "id"))):
        behind = t.stream(start=1, include_row_kind=True, stop_at_latest=True,
                          catch_up_threshold=None)
        got = [(c.snapshot_id, c.kind, _rows(c, key)) for c in behind]
        assert got == expected[i]
        assert any(kind in ("delete", "overwrite") for _, kind, _ in got)
        assert behind._changed == {}  # nothing left cached once read
    lake.close()


WRITER = r"""
import sys, time, arrowlake as al
lake = al.connect(sys.argv[1])
table = lake.table("s.t")
time.sleep(1.0)
for i in range(5):
    table.upsert({"k": [i], "v": [str(time.time())]})
    time.sleep(0.3)
"""


def test_sqlite_stream_sees_another_processes_commits_long_before_poll_interval(tmp_path):
    path = tmp_path / "lake"
    lake = al.connect(path)
    t = lake.create_table("s.t", KEYED, primary_key=["k"], buckets=2)
    stream = t.stream(start="latest", poll_interval=60)  # never polls again within the test
    watcher = signals._SQLITE_WATCHERS[lake.metastore.url]
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], env=env)
    delays = wake_delays(stream, writer)
    # Woken by the database's change counter, not by the 60 s poll.
    assert max(delays) < 2.0, delays
    # The last stream of the database closed: its watching thread (and connection) ends.
    watcher.join(5)
    assert not watcher.is_alive()
    lake.close()
