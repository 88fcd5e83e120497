"""Item 13 (metastore part): a read-only lake opens for reading and refuses writes at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa

import arrowlake as al
from arrowlake.errors import ReadOnlyLake
from arrowlake.lake import Lake
from arrowlake.metastore import Metastore

SRC = str(Path(al.__file__).resolve().parents[1])


def _make_lake(folder: Path) -> None:
    lake = al.connect(folder)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1, 2]})
    t.create_tag("v1")
    lake.close()


def test_read_only_sqlite_database_reads_and_refuses_writes_at_once(tmp_path):
    folder = tmp_path / "lake"
    _make_lake(folder)
    db = folder / "arrowlake.db"
    metastore = Metastore(f"sqlite:///file:{db}?mode=ro&uri=true")  # SQLite enforces it
    assert metastore.read_only
    lake = Lake(metastore, str(folder))
    t = lake.table("t")
    assert t.to_arrow().column("id").to_pylist() == [1, 2]
    assert t.tags() == {"v1": 1}
    started = time.monotonic()
    with pytest.raises(ReadOnlyLake, match=str(db)):
        t.append({"id": [3]})
    with pytest.raises(ReadOnlyLake):
        t.create_tag("v2")
    with pytest.raises(ReadOnlyLake):
        lake.create_table("u", pa.schema([("id", pa.int64())]))
    assert time.monotonic() - started < 2  # no commit retries
    lake.close()
    writable = al.connect(folder)
    assert writable.table("t").snapshots().num_rows == 1
    assert writable.table("t").to_arrow().num_rows == 2
    writable.close()


def test_sqlite_write_refused_by_the_database_is_not_retried(tmp_path):
    """A database that refuses writes only when they come (SQLite ``query_only``)."""
    folder = tmp_path / "lake"
    _make_lake(folder)
    lake = al.connect(folder)
    t = lake.table("t")
    engine = lake.metastore.engine
    engine.dispose()
    sa.event.listen(engine, "connect",
                    lambda dbapi_conn, _record: dbapi_conn.execute("PRAGMA query_only=ON"))
    started = time.monotonic()
    with pytest.raises(ReadOnlyLake, match="read-only"):
        t.append({"id": [3]})
    with pytest.raises(ReadOnlyLake):
        t.create_tag("v2")
    assert time.monotonic() - started < 2
    assert t.to_arrow().num_rows == 2
    written = list(Path(t.location).rglob("*.parquet"))
    assert len(written) == len(t.files()) == 1  # the refused append's file was deleted
    lake.close()


_CHILD = textwrap.dedent("""
    import sys, time, pyarrow as pa, arrowlake as al
    from arrowlake.errors import ReadOnlyLake
    lake = al.connect(sys.argv[1])
    t = lake.table("t")
    print("read", sorted(t.to_arrow().column("id").to_pylist()), t.tags())
    started = time.monotonic()
    try:
        t.append({"id": [3]})
    except ReadOnlyLake as exc:
        print("refused", round(time.monotonic() - started), str(exc))
    for sub in ("/missing", "/empty"):
        started = time.monotonic()
        try:
            al.connect(sys.argv[1] + sub)
        except ReadOnlyLake as exc:
            print(sub[1:], round(time.monotonic() - started), str(exc))
""")


def test_read_only_lake_folder_opens_for_reading(tmp_path):
    """A lake folder and database without write permission, for a process that cannot bypass
    permissions (root without CAP_DAC_OVERRIDE, through setpriv)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is needed to drop the permission override of root")
    folder = tmp_path / "lake"
    _make_lake(folder)
    (folder / "empty").mkdir()
    assert not (folder / "arrowlake.db-wal").exists()
    paths = [folder, *folder.rglob("*")]
    for path in paths:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        cmd = [sys.executable, "-c", _CHILD, str(folder)]
        if os.geteuid() == 0:
            cmd = [setpriv, "--inh-caps=-all",
                   "--bounding-set=-dac_override,-dac_read_search", *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": SRC})
    finally:
        for path in paths:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "read [1, 2] {'v1': 1}"
    assert lines[1].startswith("refused 0 ") and "read-only" in lines[1]
    assert str(folder / "arrowlake.db") in lines[1]
    assert lines[2].startswith("missing 0 ") and str(folder / "missing") in lines[2]
    assert lines[3].startswith("empty 0 ") and str(folder / "empty") in lines[3]
    lake = al.connect(folder)
    assert lake.table("t").snapshots().num_rows == 1
    lake.close()
