"""A lake with the table shapes the catalog must serve, the catalog over it, and real clients.

The clients (pyiceberg, DuckDB 1.5.5 with its iceberg extension, PySpark 4.1 with Iceberg's
runtime) run in their own environments without arrowlake (``tests/client_envs.py``). Each
runs one script over a plan of queries and writes every answer as an Arrow IPC file (or the
error it got as text), so one process start serves a whole module of tests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import arrowlake as al
from arrowlake.iceberg_rest import RunningCatalog
from tests import client_envs

CLIENTS = Path(__file__).parent / "clients"
TOKEN = "test-token-3f9a"

# DuckDB's iceberg extension calls the catalog through httpfs, which the shared environment
# lacks: this one adds it (built once, cached like the others).
DUCKDB_ENV = "iceberg-clients-httpfs"
client_envs.ENVIRONMENTS.setdefault(DUCKDB_ENV, [
    *client_envs.ENVIRONMENTS["iceberg-clients"],
    f"duckdb-extension-httpfs=={client_envs.DUCKDB_ICEBERG}",
])


# -- the lake ------------------------------------------------------------------------------------


@dataclass
class LakeFixture:
    """The lake, and the snapshots the tests travel back to."""

    lake: al.Lake
    path: Path
    marks: dict[str, int] = field(default_factory=dict)  # name -> snapshot id
    times: dict[str, datetime] = field(default_factory=dict)  # name -> a time just after it


EVENTS_SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("day", pa.date32()),
                           ("amount", pa.decimal128(18, 4)), ("v", pa.float64()),
                           ("ts", pa.timestamp("us")), ("note", pa.string())])
USERS_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False),
                          pa.field("region", pa.string(), nullable=False),
                          ("name", pa.string()), ("tier", pa.int32()), ("score", pa.float64())])


def _events(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.Table.from_pydict({
        "id": pa.array(ids, pa.int64()),
        "region": pa.array([("eu", "us", "apac")[i % 3] for i in ids]),
        "day": pa.array([date(2026, 11, 1 + i % 4) for i in ids], pa.date32()),
        "amount": pa.array([Decimal(i * 7 % 1000) / 100 for i in ids], pa.decimal128(18, 4)),
        "v": pa.array([None if i % 11 == 0 else i / 8 for i in ids], pa.float64()),
        "ts": pa.array([datetime(2026, 11, 1) + timedelta(minutes=i) for i in ids],
                       pa.timestamp("us")),
        "note": pa.array([None if i % 7 == 0 else f"n{i}" for i in ids]),
    }, schema=EVENTS_SCHEMA)


def _users(keys: range, round: int) -> pa.Table:
    ids = list(keys)
    return pa.Table.from_pydict({
        "id": pa.array(ids, pa.int64()),
        "region": pa.array([("eu", "us")[i % 2] for i in ids]),
        "name": pa.array([f"user{i}-r{round}" for i in ids]),
        "tier": pa.array([(i + round) % 4 for i in ids], pa.int32()),
        "score": pa.array([None if i % 13 == 0 else (i * round) / 3 for i in ids]),
    }, schema=USERS_SCHEMA)


def build_lake(path: Path) -> LakeFixture:
    """The tables every client test reads; each step recorded where tests travel back."""
    lake = al.connect(str(path))
    fx = LakeFixture(lake, path)
    for ns in ("shop", "crm", "empty_ns"):
        lake.create_namespace(ns)

    def mark(name: str, table: al.Table) -> None:
        fx.marks[name] = table.current_snapshot_id
        fx.times[name] = datetime.now().astimezone()

    # An append table with identity partitions: appends, then a delete that rewrites files.
    events = lake.create_table("shop.events", EVENTS_SCHEMA, partition_by=["region", "day"])
    events.append(_events(0, 300))
    mark("events_1", events)
    events.append(_events(300, 200))
    events.append(_events(500, 100))
    mark("events_3", events)
    events.delete("region = 'eu' and id < 200")
    mark("events_deleted", events)

    # A primary-key table with deletion vectors (the default) and a composite key.
    users = lake.create_table("crm.users", USERS_SCHEMA,
                              primary_key=["id", "region"], partition_by=["region"], buckets=2)
    users.upsert(_users(range(0, 400), 1))
    mark("users_1", users)
    users.upsert(_users(range(200, 600), 2))
    users.create_tag("v2", users.current_snapshot_id)
    mark("users_2", users)
    users.upsert(_users(range(0, 100, 3), 3))
    users.delete("id >= 500 and id < 550")
    mark("users_deleted", users)

    # Schema evolution: add, rename, drop, widen, with rows written between the changes.
    evo = lake.create_table("crm.evolving", pa.schema([("id", pa.int64()), ("a", pa.int32()),
                                                       ("b", pa.string())]))
    evo.append(pa.table({"id": pa.array([1, 2], pa.int64()), "a": pa.array([10, 20], pa.int32()),
                         "b": ["x", "y"]}))
    mark("evo_1", evo)
    evo.add_column("c", pa.float64())
    evo.append(pa.table({"id": pa.array([3], pa.int64()), "a": pa.array([30], pa.int32()),
                         "b": ["z"], "c": [1.5]}))
    evo.rename_column("b", "label")
    evo.drop_column("c")
    evo.alter_column("a", pa.int64())
    evo.append(pa.table({"id": pa.array([4], pa.int64()), "a": pa.array([2**40], pa.int64()),
                         "label": ["w"]}))
    mark("evo_now", evo)

    # A merge-on-read primary-key table: no Iceberg view.
    mor = lake.create_table("crm.legacy", USERS_SCHEMA, primary_key=["id"],
                            deletion_vectors=False)
    mor.upsert(_users(range(10), 1))
    return fx


@pytest.fixture(scope="package")
def lake_fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeFixture]:
    fx = build_lake(tmp_path_factory.mktemp("iceberg-rest-lake"))
    yield fx
    fx.lake.close()


@pytest.fixture(scope="package")
def catalog_url(lake_fx: LakeFixture) -> Iterator[str]:
    with RunningCatalog(lake_fx.lake, port=0, tokens=[TOKEN], shutdown_timeout=5) as running:
        yield running.url


# -- comparing rows ------------------------------------------------------------------------------


def _normal(value: Any) -> Any:
    """Values compared as users see them: NaN as a marker (NaN equals nothing), a tz-aware
    datetime in UTC."""
    if isinstance(value, float) and math.isnan(value):
        return "<NaN>"
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(tz=None).isoformat()
    return value


def rows(table: pa.Table, key: list[str]) -> list[tuple[Any, ...]]:
    order = pc.sort_indices(table, [(k, "ascending") for k in key])
    table = table.take(order)
    columns = [table.column(name).to_pylist() for name in table.column_names]
    return [tuple(_normal(v) for v in row) for row in zip(*columns, strict=True)]


def assert_same_rows(actual: pa.Table, expected: pa.Table, key: list[str]) -> None:
    """Row for row, column for column (by name, in the expected order), values cast to the
    expected types first (a client may give ``large_string`` for ``string``)."""
    assert sorted(actual.column_names) == sorted(expected.column_names), \
        (actual.column_names, expected.column_names)
    actual = pa.table({name: pc.cast(actual.column(name), expected.schema.field(name).type)
                       for name in expected.column_names})
    assert actual.num_rows == expected.num_rows
    got, want = rows(actual, key), rows(expected.select(expected.column_names), key)
    for a, b in zip(got, want, strict=True):
        assert a == b


# -- clients -------------------------------------------------------------------------------------


@dataclass
class ClientRun:
    """What one client script answered: ``table(name)`` or ``error(name)`` per query."""

    out: Path
    listing: dict[str, Any]

    def table(self, name: str) -> pa.Table:
        error = self.out / f"{name}.error.txt"
        if error.exists():
            raise AssertionError(f"query {name} failed in the client: {error.read_text()}")
        with pa.memory_map(str(self.out / f"{name}.arrow")) as source:
            return pa.ipc.open_file(source).read_all()

    def error(self, name: str) -> str:
        path = self.out / f"{name}.error.txt"
        assert path.exists(), f"query {name} succeeded in the client; expected an error"
        return path.read_text()


def run_client(env: str, script: str, plan: dict[str, Any], out: Path,
               timeout: float = 600) -> ClientRun:
    """Run ``clients/<script>`` in environment ``env`` over ``plan``; its answers."""
    python = client_envs.client_python(env)
    out.mkdir(parents=True, exist_ok=True)
    plan_path = out / "plan.json"
    plan_path.write_text(json.dumps({**plan, "out": str(out)}))
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    proc = subprocess.run([str(python), str(CLIENTS / script), str(plan_path)],
                          capture_output=True, text=True, timeout=timeout, env=environ)
    if proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-8000:]}")
    listing_path = out / "listing.json"
    listing = json.loads(listing_path.read_text()) if listing_path.exists() else {}
    return ClientRun(out, listing)
