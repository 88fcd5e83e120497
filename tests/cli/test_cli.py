"""The ``arrowlake`` command line, run in-process through ``main([...])``."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from datetime import date
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from arrowlake.cli.commands import parse_duration
from arrowlake.cli.main import main
from arrowlake.cli.output import format_table, jsonable
from arrowlake.cli.progress import ProgressBar

CSV = "id,name,day,amount\n1,alice,2024-01-01,10.5\n2,bob,2024-01-02,3.25\n3,\"c, d\",2024-01-02,\n"
JSONL = ('{"id": 4, "name": "dan", "day": "2024-01-03", "amount": 1.5}\n'
         '{"id": 5, "name": "eve", "day": "2024-01-03", "amount": null}\n')


@pytest.fixture
def lake_path(tmp_path: Path) -> Path:
    path = tmp_path / "lake"
    al.connect(path).close()
    return path


@pytest.fixture
def run(lake_path: Path, capsys: pytest.CaptureFixture[str]):
    """``run("tables")`` -> (exit code, stdout, stderr) of ``arrowlake --lake <lake> tables``."""

    def run(*args: str, json_output: bool = False) -> tuple[int, str, str]:
        argv = ["--lake", str(lake_path)] + (["--json"] if json_output else []) + list(args)
        code = main(argv)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def run_json(run):
    """Run a command with ``--json``; assert success and return the parsed stdout."""

    def run_json(*args: str):
        code, out, err = run(*args, json_output=True)
        assert code == 0, err
        return json.loads(out)

    return run_json


@pytest.fixture
def orders(lake_path: Path, tmp_path: Path, run) -> str:
    """``shop.orders`` created by importing a CSV file, partitioned by day (3 rows)."""
    csv = tmp_path / "orders.csv"
    csv.write_text(CSV)
    code, _, err = run("import", str(csv), "shop.orders", "--create", "--partition-by", "day")
    assert code == 0, err
    return "shop.orders"


def read_table(lake_path: Path, name: str, key: str = "id") -> pa.Table:
    with al.connect(lake_path) as lake:
        return lake.table(name).to_arrow().sort_by(key)


# -- listing and showing -----------------------------------------------------------------------


def test_tables_lists_names_as_text_and_json(run, run_json, orders):
    code, out, _ = run("tables")
    assert code == 0
    assert "shop" in out and "orders" in out
    assert run_json("tables") == ["shop.orders"]
    assert run_json("tables", "shop") == ["shop.orders"]
    assert run_json("tables", "other") == []


def test_json_flag_is_accepted_after_the_command(run, orders):
    code, out, _ = run("tables", "--json")
    assert code == 0
    assert json.loads(out) == ["shop.orders"]


def test_show_describes_schema_partitioning_and_snapshot(run, run_json, orders):
    info = run_json("show", orders)
    assert info["name"] == "shop.orders"
    assert [(f["name"], f["type"], f["id"]) for f in info["schema"]] == [
        ("id", "int64", 1), ("name", "string", 2), ("day", "date32[day]", 3),
        ("amount", "double", 4)]
    assert info["partition_by"] == ["day"]
    assert info["primary_key"] == []
    snap = info["current_snapshot"]
    assert snap["kind"] == "append"
    assert snap["total_rows"] == 3
    assert snap["committed_at"].startswith("20")  # an ISO timestamp string

    code, out, _ = run("show", orders)
    assert code == 0
    assert "partition by: day" in out
    assert "date32[day]" in out
    assert "total rows:   3" in out


def test_show_an_empty_table(run_json, lake_path):
    with al.connect(lake_path) as lake:
        lake.create_table("t", pa.schema([("x", pa.int64())]), properties={"owner": "me"})
    info = run_json("show", "t")
    assert info["current_snapshot"] is None
    assert info["properties"] == {"owner": "me"}


def test_snapshots_history(run, run_json, orders, tmp_path):
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text(JSONL)
    assert run("import", str(jsonl), orders)[0] == 0
    history = run_json("snapshots", orders)
    assert [s["kind"] for s in history] == ["append", "append"]
    assert [s["total_rows"] for s in history] == [3, 5]
    assert history[1]["parent_id"] == history[0]["snapshot_id"]
    assert isinstance(history[0]["summary"], dict)
    code, out, _ = run("snapshots", orders)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["snapshot_id", "parent_id", "kind"]
    assert len(lines) == 4  # header, rule, two snapshots


def test_files_lists_live_files_with_partitions(run, run_json, orders):
    files = run_json("files", orders)
    assert sorted(f["partition"]["day"] for f in files) == ["2024-01-01", "2024-01-02"]
    assert sum(f["rows"] for f in files) == 3
    assert all(os.path.exists(f["path"]) and f["size"] > 0 for f in files)
    code, out, _ = run("files", orders)
    assert code == 0
    assert "day=2024-01-02" in out
    assert "2 files under" in out


# -- head --------------------------------------------------------------------------------------


def test_head_prints_first_rows(run, run_json, orders):
    rows = run_json("head", orders)
    assert sorted(r["id"] for r in rows) == [1, 2, 3]
    assert len(run_json("head", orders, "-n", "2")) == 2
    assert run_json("head", orders, "-n", "0") == []
    code, out, _ = run("head", orders, "--columns", "id,name")
    assert code == 0
    assert out.splitlines()[0].split() == ["id", "name"]
    assert "c, d" in out


def test_head_with_filter_and_columns(run_json, orders):
    rows = run_json("head", orders, "--filter", "amount > 3 and day = '2024-01-02'",
                    "--columns", "id,amount")
    assert rows == [{"id": 2, "amount": 3.25}]


def test_head_json_encodes_dates_decimals_and_bytes(run_json, lake_path):
    with al.connect(lake_path) as lake:
        t = lake.create_table("typed", pa.schema([("d", pa.date32()),
                                                  ("m", pa.decimal128(10, 2)),
                                                  ("b", pa.binary()),
                                                  ("ts", pa.timestamp("us", tz="UTC"))]))
        t.append(pa.table({"d": [date(2024, 5, 6)], "m": [Decimal("12.30")], "b": [b"\x00\xff"],
                           "ts": pa.array([1_700_000_000_000_000], pa.timestamp("us", "UTC"))}))
    [row] = run_json("head", "typed")
    assert row == {"d": "2024-05-06", "m": "12.30", "b": "AP8=",
                   "ts": "2023-11-14T22:13:20+00:00"}


# -- import ------------------------------------------------------------------------------------


def test_import_csv_creates_a_partitioned_table(lake_path, orders):
    data = read_table(lake_path, orders)
    assert data.column("id").to_pylist() == [1, 2, 3]
    assert data.column("name").to_pylist() == ["alice", "bob", "c, d"]
    assert data.column("day").type == pa.date32()
    assert data.column("amount").to_pylist() == [10.5, 3.25, None]
    with al.connect(lake_path) as lake:
        assert lake.table(orders).partition_by == ["day"]


def test_import_jsonl_into_existing_table_uses_its_types(run, run_json, lake_path, orders,
                                                         tmp_path):
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text(JSONL)
    result = run_json("import", str(jsonl), orders)
    assert result["rows"] == 2 and result["created"] is False
    data = read_table(lake_path, orders)
    assert data.column("id").to_pylist() == [1, 2, 3, 4, 5]
    assert data.column("day").to_pylist()[-1] == date(2024, 1, 3)


def test_import_parquet_and_several_files_in_one_commit(run_json, lake_path, orders, tmp_path):
    pq.write_table(pa.table({"id": [10, 11], "name": ["x", "y"],
                             "day": [date(2024, 2, 1)] * 2, "amount": [1.0, 2.0]}),
                   tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_text(JSONL)
    (tmp_path / "c.csv").write_text("id,name,day,amount\n20,z,2024-03-01,7\n")
    before = len(run_json("snapshots", orders))
    result = run_json("import", str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl"),
                      str(tmp_path / "c.csv"), orders)
    assert result["rows"] == 5
    assert len(run_json("snapshots", orders)) == before + 1
    assert read_table(lake_path, orders).num_rows == 8


def test_import_with_explicit_format(run_json, lake_path, tmp_path):
    path = tmp_path / "data.txt"
    path.write_text('{"x": 1}\n{"x": 2}\n')
    result = run_json("import", str(path), "t", "--create", "--format", "jsonl")
    assert result["created"] is True
    assert read_table(lake_path, "t", key="x").column("x").to_pylist() == [1, 2]


def test_import_into_missing_table_without_create_fails(run, orders, tmp_path):
    csv = tmp_path / "x.csv"
    csv.write_text(CSV)
    code, out, err = run("import", str(csv), "shop.missing")
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and "--create" in err
    assert "Traceback" not in err


def test_failed_create_import_leaves_no_table(run, run_json, tmp_path):
    csv = tmp_path / "bad.csv"
    csv.write_text("a,b\n1,2\n")
    missing = tmp_path / "nope.csv"
    code, _, err = run("import", str(csv), str(missing), "t", "--create")
    assert code == 2 and "nope.csv" in err
    assert run_json("tables") == []


def test_import_of_mismatching_data_is_an_error(run, orders, tmp_path):
    csv = tmp_path / "other.csv"
    csv.write_text("unknown\n1\n")
    code, _, err = run("import", str(csv), orders)
    assert code == 2
    assert "unknown" in err


def test_import_unknown_extension_asks_for_format(run, orders, tmp_path):
    path = tmp_path / "data.xyz"
    path.write_text("x\n1\n")
    code, _, err = run("import", str(path), orders)
    assert code == 2 and "--format" in err


def test_import_progress_goes_to_stderr_only(run, lake_path, tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text(CSV)
    code, out, err = run("import", str(csv), "t", "--create", "--progress")
    assert code == 0
    assert "\r" in err and "100%" in err
    assert "\r" not in out and "%" not in out


def test_import_without_a_terminal_shows_no_progress(run, tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text(CSV)
    code, _, err = run("import", str(csv), "t", "--create")
    assert code == 0
    assert err == ""


# -- export ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_export_round_trip(run_json, lake_path, orders, tmp_path, fmt):
    out = tmp_path / f"out.{fmt}"
    result = run_json("export", orders, str(out))
    assert result["rows"] == 3 and result["format"] == fmt
    if fmt == "jsonl":
        # JSON has no date type: reading it back needs the table's schema to say so.
        with al.connect(lake_path) as lake:
            lake.create_table("copy", lake.table(orders).schema)
        assert run_json("import", str(out), "copy")["rows"] == 3
    else:
        assert run_json("import", str(out), "copy", "--create")["rows"] == 3
    original = read_table(lake_path, orders)
    copy = read_table(lake_path, "copy")
    assert copy.to_pylist() == original.to_pylist()


def test_export_with_filter_and_columns(run_json, orders, tmp_path):
    out = tmp_path / "some.parquet"
    result = run_json("export", orders, str(out), "--filter", "id >= 2", "--columns", "id,name")
    assert result["rows"] == 2
    data = pq.read_table(out).sort_by("id")
    assert data.column_names == ["id", "name"]
    assert data.column("id").to_pylist() == [2, 3]


def test_export_format_flag_overrides_extension(run_json, orders, tmp_path):
    out = tmp_path / "rows.txt"
    run_json("export", orders, str(out), "--format", "jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [1, 2, 3]
    assert {r["day"] for r in rows} == {"2024-01-01", "2024-01-02"}


def test_export_failure_leaves_no_file(run, orders, tmp_path):
    out = tmp_path / "out.parquet"
    code, _, err = run("export", orders, str(out), "--filter", "nope = 1")
    assert code == 2 and "nope" in err
    assert not out.exists()
    code, _, err = run("export", orders, str(tmp_path / "no" / "such" / "dir.csv"))
    assert code == 2 and "error:" in err
    assert list(tmp_path.glob(".*.tmp")) == []


# -- errors ------------------------------------------------------------------------------------


def test_missing_table_is_exit_2_with_message(run):
    code, out, err = run("show", "shop.nope")
    assert code == 2
    assert out == ""
    assert err == "error: Table 'shop.nope' does not exist\n"


def test_bad_filter_is_exit_2_with_message(run, orders):
    code, out, err = run("head", orders, "--filter", "id >> 3")
    assert code == 2
    assert out == ""
    assert err.startswith("error: ")
    assert "id >> 3" in err and "^" in err
    assert "Traceback" not in err


def test_unknown_column_in_filter(run, orders):
    code, _, err = run("head", orders, "--filter", "idx > 1")
    assert code == 2 and "'idx'" in err


def test_missing_lake_is_not_created(tmp_path, capsys):
    missing = tmp_path / "typo"
    assert main(["--lake", str(missing), "tables"]) == 2
    assert "No lake at" in capsys.readouterr().err
    assert not missing.exists()


def test_no_lake_given(capsys, monkeypatch):
    monkeypatch.delenv("ARROWLAKE_LAKE", raising=False)
    assert main(["tables"]) == 2
    assert "--lake" in capsys.readouterr().err


def test_lake_from_environment(lake_path, capsys, monkeypatch):
    monkeypatch.setenv("ARROWLAKE_LAKE", str(lake_path))
    assert main(["--json", "tables"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_usage_errors_exit_2(run):
    code, _, err = run("expire", "t", "--older-than", "3x")
    assert code == 2 and "is not a duration" in err
    code, _, err = run("frobnicate")
    assert code == 2 and "invalid choice" in err


@pytest.mark.parametrize("command", [[], ["tables"], ["show"], ["snapshots"], ["files"],
                                     ["head"], ["import"], ["export"], ["expire"], ["orphans"]])
def test_help_everywhere(command, capsys):
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: arrowlake")


# -- maintenance -------------------------------------------------------------------------------


def test_expire_keeps_the_newest_snapshots(run, run_json, lake_path, orders, tmp_path):
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text(JSONL)
    for _ in range(3):
        assert run("import", str(jsonl), orders)[0] == 0
    history = run_json("snapshots", orders)
    assert len(history) == 4
    # Nothing is a week old yet.
    assert run_json("expire", orders, "--older-than", "7d")["expired_snapshots"] == []
    result = run_json("expire", orders, "--older-than", "0s", "--retain-last", "2")
    assert result["expired_snapshots"] == [s["snapshot_id"] for s in history[:2]]
    assert [s["snapshot_id"] for s in run_json("snapshots", orders)] == \
        [s["snapshot_id"] for s in history[2:]]
    code, out, _ = run("expire", orders)
    assert code == 0 and "Expired 1 snapshot of shop.orders" in out
    assert read_table(lake_path, orders).num_rows == 9


def test_orphans_lists_then_deletes_a_stray_file(run, run_json, orders):
    location = Path(run_json("show", orders)["location"])
    stray = location / "data" / "stray.parquet"
    stray.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": [1]}), stray)

    # Younger than the default 1d: could belong to a write in progress, so not an orphan yet.
    assert run_json("orphans", orders)["files"] == []
    found = run_json("orphans", orders, "--older-than", "0s")
    assert found["files"] == [str(stray)]
    assert found["dry_run"] is True and found["bytes"] == stray.stat().st_size
    assert stray.exists()

    code, out, _ = run("orphans", orders, "--older-than", "0s")
    assert code == 0 and str(stray) in out and "--delete" in out

    deleted = run_json("orphans", orders, "--older-than", "0s", "--delete")
    assert deleted["files"] == [str(stray)] and deleted["dry_run"] is False
    assert not stray.exists()
    assert run_json("orphans", orders, "--older-than", "0s")["files"] == []
    assert run_json("head", orders, "-n", "100") != []  # live files untouched


# -- pieces ------------------------------------------------------------------------------------


def test_parse_duration():
    assert parse_duration("0s").total_seconds() == 0
    assert parse_duration("30m").total_seconds() == 1800
    assert parse_duration("12h").total_seconds() == 12 * 3600
    assert parse_duration("7d").days == 7
    assert parse_duration("1h30m").total_seconds() == 5400


def test_format_table_aligns_columns():
    text = format_table([{"name": "a", "n": 3}, {"name": "long", "n": 120}], ["name", "n"])
    assert text.splitlines() == ["name    n", "----  ---", "a       3", "long  120"]


def test_jsonable_values():
    assert jsonable({"d": date(2024, 1, 2), "m": Decimal("1.10"), "b": b"hi",
                     "f": float("nan"), "l": [1, None]}) == {
        "d": "2024-01-02", "m": "1.10", "b": "aGk=", "f": "nan", "l": [1, None]}


def test_progress_bar_redraws_in_place():
    stream = io.StringIO()
    with ProgressBar(stream, 200, label="x", unit="rows") as bar:
        bar.set(200)
    text = stream.getvalue()
    assert text.startswith("\rx [") and text.endswith("\n")
    assert "200 / 200 rows" in text
    silent = io.StringIO()
    with ProgressBar(silent, 10, enabled=False) as bar:
        bar.advance(5)
    assert silent.getvalue() == ""


# -- the installed script ----------------------------------------------------------------------


def test_console_script_runs(lake_path, orders):
    script = Path(sys.executable).with_name("arrowlake")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "arrowlake.cli.main"]
    done = subprocess.run([*cmd, "--lake", str(lake_path), "--json", "head", orders, "-n", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 1
    failed = subprocess.run([*cmd, "--lake", str(lake_path), "show", "shop.nope"],
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2
    assert failed.stderr == "error: Table 'shop.nope' does not exist\n"
    assert failed.stdout == ""


def test_import_a_directory_and_compressed_files(run_json, lake_path, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "a.csv").write_text("x,y\n1,a\n")
    with gzip.open(folder / "b.csv.gz", "wt") as f:
        f.write("x,y\n2,b\n")
    (folder / "c.tsv").write_text("x\ty\n3\tc\n")
    (folder / "_SUCCESS").write_text("")
    result = run_json("import", str(folder), "t", "--create")
    assert result["rows"] == 3 and len(result["files"]) == 3
    data = read_table(lake_path, "t", key="x")
    assert data.to_pylist() == [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}, {"x": 3, "y": "c"}]
