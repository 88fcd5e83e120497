"""Databases of schema version 1 (made by arrowlake before ids were made unique) keep opening:
they are upgraded in place, keeping every row."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa

import arrowlake as al
from arrowlake.metastore import tables as t
from tests.conftest import METASTORES, make_lake

V1_SQLITE_DDL = (Path(__file__).parent / "schema_v1_sqlite.sql").read_text()


def _fill(lake: al.Lake) -> tuple[datetime, list[int]]:
    """Tables with partitions, removed and expired files, a tag; returns a time between two
    commits and the file ids in use."""
    plain = lake.create_table("shop.plain", pa.schema([("id", pa.int64()), ("p", pa.string())]),
                              partition_by=["p"])
    plain.append({"id": [1, 2], "p": ["a", "b"]})
    plain.create_tag("first")
    plain.append({"id": [3], "p": ["a"]})
    when = datetime.now(UTC)
    plain.delete("id = 2")
    keyed = lake.create_table(
        "shop.keyed", pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())]),
        primary_key=["k"], buckets=2)
    keyed.upsert({"k": [1, 2], "v": [1, 2]})
    keyed.upsert({"k": [1], "v": [10]})
    return when, plain.files().column("file_id").to_pylist() + \
        keyed.files().column("file_id").to_pylist()


def _check_opened(lake: al.Lake, when: datetime) -> None:
    plain, keyed = lake.table("shop.plain"), lake.table("shop.keyed")
    assert sorted(plain.to_arrow().column("id").to_pylist()) == [1, 3]
    assert sorted(plain.scan(tag="first").to_arrow().column("id").to_pylist()) == [1, 2]
    assert sorted(plain.scan(as_of=when).to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert sorted(keyed.to_arrow().to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "v": 10}, {"k": 2, "v": 2}]
    assert plain.files().column("partition").to_pylist() == [{"p": "a"}, {"p": "a"}]


def _sqlite_v1_lake(tmp_path: Path) -> tuple[Path, datetime, list[int], list[int]]:
    """A lake folder whose database has the version-1 DDL, holding the rows of ``_fill``."""
    folder = tmp_path / "lake"
    lake = al.connect(folder)
    when, file_ids = _fill(lake)
    table_ids = [lake.table(n)._record.table_id for n in ("shop.plain", "shop.keyed")]
    lake.close()
    # The same rows in a database made with the version-1 DDL, as the old code left them.
    db = folder / "arrowlake.db"
    old = tmp_path / "v1.db"
    con = sqlite3.connect(old)
    con.executescript(V1_SQLITE_DDL)
    con.execute("ATTACH DATABASE ? AS cur", (str(db),))
    for table in t.metadata.sorted_tables:
        cols = [c[1] for c in con.execute(f"PRAGMA main.table_info({table.name})")]
        if not cols:  # a table added after version 1
            continue
        names = ", ".join(f'"{c}"' for c in cols)
        con.execute(f"INSERT INTO main.{table.name} ({names}) SELECT {names} "
                    f"FROM cur.{table.name}")
    con.execute("UPDATE al_meta SET value = '1' WHERE key = 'version'")
    con.commit()
    con.execute("DETACH DATABASE cur")
    con.close()
    old.replace(db)
    return folder, when, file_ids, table_ids


def test_sqlite_v1_database_is_upgraded_and_ids_are_not_reused(tmp_path):
    folder, when, file_ids, table_ids = _sqlite_v1_lake(tmp_path)
    db = folder / "arrowlake.db"
    lake = al.connect(folder)
    _check_opened(lake, when)
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM al_meta").fetchall() == [(str(t.SCHEMA_VERSION),)]
    for name in ("al_tables", "al_partitions", "al_files"):
        ddl = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
        assert "AUTOINCREMENT" in ddl
    assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    for name in ("al_files", "al_partitions", "al_snapshots"):
        parents = {r[2] for r in con.execute(f"PRAGMA foreign_key_list({name})")}
        assert parents == {"al_tables"}
    indexes = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"al_files_added", "al_files_removed", "al_snapshots_commit",
            "al_snapshots_token"} <= indexes
    con.close()

    # Freed ids stay freed: drop a table, delete the newest files and expire them.
    plain = lake.table("shop.plain")
    plain.delete("id >= 1")
    plain.expire_snapshots()
    plain.append({"id": [7], "p": ["c"]})
    assert min(plain.files().column("file_id").to_pylist()) > max(file_ids)
    lake.drop_table("shop.keyed")
    again = lake.create_table("shop.keyed", pa.schema([("k", pa.int64())]))
    assert again._record.table_id > max(table_ids)
    lake.close()
    al.connect(folder).close()  # opening an upgraded database again changes nothing


def test_postgres_v1_database_is_upgraded(pg_server, tmp_path):
    url = pg_server.create_database()
    lake = al.connect(url, warehouse=str(tmp_path / "wh"))
    when, _ = _fill(lake)
    lake.close()
    engine = sa.create_engine("postgresql+psycopg://" + url.split("://", 1)[1])
    with engine.begin() as conn:  # back to the version-1 tables
        conn.exec_driver_sql("ALTER TABLE al_snapshots DROP COLUMN write_token, "
                             "DROP COLUMN superseded_at")
        conn.exec_driver_sql("UPDATE al_meta SET value = '1' WHERE key = 'version'")

    lake = al.connect(url, warehouse=str(tmp_path / "wh"))
    _check_opened(lake, when)
    lake.table("shop.plain").append({"id": [8], "p": ["a"]})
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT value FROM al_meta").scalar_one() == \
            str(t.SCHEMA_VERSION)
        cols = {r[0] for r in conn.exec_driver_sql(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'al_snapshots'")}
        assert {"write_token", "superseded_at"} <= cols
    engine.dispose()
    lake.close()


_V6 = ["al_maintenance_leases", "al_maintenance_log"]


@pytest.mark.parametrize("kind", METASTORES)
@pytest.mark.parametrize(("version", "added"), [
    (2, [*_V6, "al_vectors", "al_consumer_leases", "al_consumers"]),
    (3, [*_V6, "al_vectors", "al_consumer_leases"]),
    (4, [*_V6, "al_vectors"]),
    (5, _V6),
])
def test_version_2_database_gets_the_consumers_table(kind, version, added, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table("s.t", pa.schema([("x", pa.int64())]))
    table.append({"x": [1]})
    url = lake.metastore.url
    warehouse = lake.warehouse
    engine = lake.metastore.engine
    with engine.begin() as conn:  # back to the tables of that version
        for name in added:
            conn.exec_driver_sql(f"DROP TABLE {name}")
        conn.exec_driver_sql(f"UPDATE al_meta SET value = '{version}' WHERE key = 'version'")
    lake.close()
    lake = al.connect(url, warehouse=warehouse)
    with lake.metastore.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT value FROM al_meta").scalar_one() == str(
            t.SCHEMA_VERSION)
    table = lake.table("s.t")
    with table.stream(consumer="c", stop_at_latest=True) as stream:
        [change] = list(stream)
        stream.commit(change.snapshot_id)
    assert table.consumers().column("next_snapshot").to_pylist() == [2]
    keyed = lake.create_table("s.dv", pa.schema([pa.field("k", pa.int64(), nullable=False),
                                                 ("v", pa.int64())]),
                              primary_key=["k"], deletion_vectors=True)
    keyed.upsert({"k": [1, 2], "v": [1, 2]})
    keyed.upsert({"k": [2], "v": [20]})
    assert sorted(keyed.to_arrow().to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "v": 1}, {"k": 2, "v": 20}]
    keyed.set_properties(**{"compaction.mode": "deferred"})
    keyed.upsert({"k": [1], "v": [10]})
    keyed.upsert({"k": [1], "v": [11]})
    # Files with half their rows deleted are due: compacted, and recorded in the new tables.
    assert [a.action for a in lake.maintain(["s.dv"])] == ["compact"]
    assert keyed.health().last_maintenance.action == "compact"
    lake.close()


_OPEN_AND_READ = """
import sys, arrowlake as al
lake = al.connect(sys.argv[1])
print(sorted(lake.table("shop.plain").to_arrow().column("id").to_pylist()))
"""


def test_sqlite_v1_database_opened_by_several_processes_at_once(tmp_path):
    folder, _, _, _ = _sqlite_v1_lake(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(al.__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_AND_READ, str(folder)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["[1, 3]"] * 4
    con = sqlite3.connect(folder / "arrowlake.db")
    assert con.execute("SELECT value FROM al_meta").fetchall() == [(str(t.SCHEMA_VERSION),)]
    assert con.execute("SELECT count(*) FROM al_files").fetchone()[0] > 0
    con.close()
