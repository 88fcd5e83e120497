"""``arrowlake maintain``, ``status``, ``compact`` and the progress bars of ``compact``,
``expire`` and ``orphans``, run in-process through ``main([...])``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.cli.main import main

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])


@pytest.fixture
def lake_path(tmp_path: Path) -> Path:
    path = tmp_path / "lake"
    with al.connect(path) as lake:
        for name, mode in (("m.deferred", "deferred"), ("m.inline", "inline")):
            # Merge-on-read: the service compacts the runs the writes leave.
            table = lake.create_table(name, SCHEMA, primary_key=["id"], buckets=2,
                                      deletion_vectors=False, properties={
                "compaction.mode": mode, "compaction.max-runs": "3",
                "snapshot.retain-last": "2"})
            for i in range(5):
                table.upsert({"id": list(range(16)), "v": [i] * 16})
    return path


def run(lake_path: Path, capsys: pytest.CaptureFixture[str], *args: str
        ) -> tuple[int, str, str]:
    code = main(["--lake", str(lake_path), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_maintain_once_prints_one_json_line_per_action(lake_path, capsys):
    code, out, err = run(lake_path, capsys, "--json", "maintain", "--once")
    assert code == 0, err
    actions = [json.loads(line) for line in out.splitlines()]
    assert {(a["table"], a["action"]) for a in actions} == {
        ("m.deferred", "compact"), ("m.deferred", "expire"), ("m.inline", "expire")}
    compact = next(a for a in actions if a["action"] == "compact")
    assert compact["buckets"] == [0, 1] and compact["read_bytes"] > compact["written_bytes"]
    code, out, err = run(lake_path, capsys, "maintain", "--once")
    assert (code, out) == (0, "")  # nothing left to do


def test_maintain_text_lines_and_table_choice(lake_path, capsys):
    code, out, err = run(lake_path, capsys, "maintain", "--once", "m.inline",
                         "--max-concurrent", "2", "--bytes-per-second", "10M")
    assert code == 0, err
    [line] = out.splitlines()
    # 5 writes and the compaction one of them made inline: 6 snapshots, 2 kept.
    assert "expire" in line and "m.inline" in line and "4 snapshots" in line
    code, _, err = run(lake_path, capsys, "maintain", "--once", "m.nope")
    assert code == 2 and "m.nope" in err
    code, _, err = run(lake_path, capsys, "maintain", "--bytes-per-second", "fast")
    assert code == 2 and "invalid size" in err


def test_status_reports_every_table_as_text_and_json(lake_path, capsys):
    code, out, err = run(lake_path, capsys, "status")
    assert code == 0, err
    lines = out.splitlines()
    assert "runs max/mean" in lines[0] and "last maintenance" in lines[0]
    deferred = next(line for line in lines if line.startswith("m.deferred"))
    assert "deferred" in deferred and "5/5.0" in deferred
    run(lake_path, capsys, "maintain", "--once")
    code, out, err = run(lake_path, capsys, "status", "m.deferred", "--json")
    assert code == 0, err
    [health] = json.loads(out)
    assert health["table"] == "m.deferred" and health["runs_max"] == 1
    assert health["snapshots"] == 2
    assert {m["action"] for m in health["maintenance"]} == {"compact", "expire"}


def test_compact_with_a_progress_bar_on_stderr(lake_path, capsys):
    code, out, err = run(lake_path, capsys, "--json", "compact", "m.deferred", "--progress")
    assert code == 0, err
    value = json.loads(out)
    assert value["buckets"] == 2 and value["removed_files"] == 10 and value["added_files"] == 2
    assert "compact m.deferred [" in err and "100%" in err
    code, out, err = run(lake_path, capsys, "compact", "m.deferred")
    assert (code, err) == (0, "")  # no terminal: no bar
    assert out.startswith("Nothing to compact")


def test_expire_and_orphans_show_progress_when_asked(lake_path, capsys):
    run(lake_path, capsys, "compact", "m.deferred")
    code, out, err = run(lake_path, capsys, "expire", "m.deferred", "--progress")
    assert code == 0, err
    assert "Expired 5 snapshots" in out and "expire m.deferred [" in err and "files" in err
    with al.connect(lake_path) as lake:
        table = lake.table("m.deferred")
        with table._storage.open_output(f"{table.location}/data/stray.parquet") as f:
            f.write(b"x" * 100)
    code, out, err = run(lake_path, capsys, "orphans", "m.deferred", "--older-than", "0s",
                         "--delete", "--progress")
    assert code == 0, err
    assert "Deleted 1 orphan file" in out and "orphans m.deferred [" in err
