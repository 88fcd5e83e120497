"""``arrowlake tail``, and PostgreSQL notifications waking streams of other processes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

import arrowlake as al
from arrowlake.cli.main import main
from tests.conftest import make_lake, wake_delays

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())])


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_tail_prints_changes_with_row_kinds_and_records_consumer_progress(tmp_path, capsys):
    path = tmp_path / "lake"
    with al.connect(path) as lake:
        t = lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                              changelog_producer="lookup")
        t.upsert({"k": [1, 2], "v": ["a", "b"]})
        t.upsert({"k": [1], "v": ["c"]})
    code = main(["--lake", str(path), "--json", "tail", "s.t", "--from", "earliest",
                 "--row-kind", "--consumer", "cli", "--stop-at-latest"])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(lines, key=lambda r: (r["_snapshot_id"], r["k"])) == [
        {"_snapshot_id": 1, "k": 1, "v": "a", "_row_kind": "+I"},
        {"_snapshot_id": 1, "k": 2, "v": "b", "_row_kind": "+I"},
        {"_snapshot_id": 2, "k": 1, "v": "a", "_row_kind": "-U"},
        {"_snapshot_id": 2, "k": 1, "v": "c", "_row_kind": "+U"},
    ]
    with al.connect(path) as lake:
        assert lake.table("s.t").consumers().column("next_snapshot").to_pylist() == [3]
    assert main(["--lake", str(path), "tail", "s.t", "--consumer", "cli",
                 "--stop-at-latest"]) == 0
    assert capsys.readouterr().out == ""  # resumed after snapshot 2: nothing new
    assert main(["--lake", str(path), "tail", "s.t", "--from", "1", "--stop-at-latest"]) == 0
    text = capsys.readouterr().out
    assert "-- snapshot 1 (upsert" in text and "-- snapshot 2 (upsert" in text
    assert main(["--lake", str(path), "tail", "s.t", "--from", "soon"]) == 2


def test_tail_runs_until_ctrl_c(tmp_path):
    path = tmp_path / "lake"
    with al.connect(path) as lake:
        lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2)
    errors = (tmp_path / "tail.err").open("w")
    # A child inherits an ignored SIGINT (pytest-xdist's workers may ignore it), and Python
    # then never turns Ctrl-C into KeyboardInterrupt: the faulthandler dump of a hung run
    # showed tail still waiting for changes. A terminal's Ctrl-C arrives with the default
    # disposition, which this restores before the command runs.
    start_as_from_a_terminal = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv[0] = 'arrowlake'; runpy.run_module('arrowlake.cli.main', run_name='__main__')")
    proc = subprocess.Popen(
        [sys.executable, "-c", start_as_from_a_terminal, "--lake", str(path), "--json", "tail",
         "s.t", "--from", "earliest", "--poll-interval", "0.05"],
        stdout=subprocess.PIPE, stderr=errors, text=True,
        env={**_env(), "PYTHONFAULTHANDLER": "1"})
    errors.close()  # the child has its own descriptor
    try:
        with al.connect(path) as lake:
            lake.table("s.t").upsert({"k": [7], "v": ["x"]})
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "tail printed nothing within 60 s"
        line = proc.stdout.readline()
        assert json.loads(line) == {"_snapshot_id": 1, "k": 7, "v": "x"}
        assert proc.poll() is None  # still waiting for more
    finally:
        proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        # Show where every thread of the tail process was (faulthandler prints them on
        # SIGABRT).
        proc.send_signal(signal.SIGABRT)
        proc.wait(30)
        raise AssertionError("tail did not exit within 30 s of Ctrl-C; its threads:\n"
                             + (tmp_path / "tail.err").read_text()) from None
    assert code == 0, (tmp_path / "tail.err").read_text()


WRITER = r"""
import sys, time, arrowlake as al
uri, warehouse = sys.argv[1], sys.argv[2]
lake = al.connect(uri, warehouse=warehouse)
table = lake.table("s.t")
time.sleep(1.0)
for i in range(5):
    table.upsert({"k": [i], "v": [str(time.time())]})
    time.sleep(0.2)
"""


def test_postgres_notify_wakes_a_stream_in_another_process(tmp_path, request):
    lake = make_lake("postgres", tmp_path, request)
    t = lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2)
    uri = lake.metastore.engine.url.render_as_string(hide_password=False)
    stream = t.stream(start="latest", poll_interval=60)  # never polls again within the test
    writer = subprocess.Popen([sys.executable, "-c", WRITER, uri, lake.warehouse], env=_env())
    delays = wake_delays(stream, writer)
    assert max(delays) < 2.0, delays  # woken by NOTIFY, not by the 60 s poll
    lake.close()
