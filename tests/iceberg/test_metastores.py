"""The publication records on both metastores: a version 6 database gets the al_iceberg_*
tables when it is upgraded, and concurrent publishers (separate connections, on PostgreSQL
too) leave exactly one recorded publication and none of the losers' files."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.iceberg import publish, published
from arrowlake.metastore import tables as t
from tests.conftest import METASTORES, make_lake

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)),
                     "name": [f"n{i}" for i in range(start, start + n)]}, SCHEMA)


@pytest.mark.parametrize("kind", METASTORES)
def test_a_version_6_database_gets_the_publication_tables(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table("s.t", SCHEMA)
    table.append(_rows(0, 3))
    url, warehouse = lake.metastore.url, lake.warehouse
    with lake.metastore.engine.begin() as conn:  # back to version 6's tables
        for name in reversed([x.name for x in t.ICEBERG_TABLES]):
            conn.exec_driver_sql(f"DROP TABLE {name}")
        conn.exec_driver_sql("UPDATE al_meta SET value = '6' WHERE key = 'version'")
    lake.close()
    lake = al.connect(url, warehouse=warehouse)
    table = lake.table("s.t")
    found = publish(table)
    assert found.snapshot_id == 1 and published(table) == found
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_concurrent_publishers_on_separate_connections(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    events = lake.create_table("s.events", SCHEMA)
    for i in range(4):
        events.append(_rows(i * 10, 10))
    url, warehouse = lake.metastore.url, lake.warehouse
    others = [al.connect(url, warehouse=warehouse) for _ in range(4)]
    start = threading.Barrier(len(others))
    results: list = []
    errors: list = []

    def run(other: al.Lake) -> None:
        try:
            start.wait()
            results.append(publish(other.table("s.events")))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(o,)) for o in others]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for other in others:
        other.close()
    assert errors == []
    current = published(events)
    assert current is not None and {r.metadata_location for r in results} == \
        {current.metadata_location}
    recorded = {events._storage.join(events.location, p)
                for p in lake.metastore.iceberg_file_paths(events._record.table_id)}
    on_disk = {str(p) for p in (Path(events.location) / "metadata").iterdir()}
    assert on_disk == recorded
    lake.close()
