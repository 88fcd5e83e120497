"""TPC-H through the catalog (slow): Spark 4.1's Iceberg reader over our tables gives, for all
22 queries, the answers Spark's Parquet reader gives over the same live rows.

Data from ``tpchgen-cli`` (scale 0.1). ``customer`` and ``part`` are primary-key tables with
deletion vectors, loaded with changed balances and prices and then upserted back in part (and
a few customers deleted), so the vectors decide which version of a row each query sees;
the other tables are append tables, ``lineitem`` in two commits.
"""

from __future__ import annotations

import math
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from arrowlake.iceberg_rest import RunningCatalog
from tests import client_envs
from tests.iceberg_rest.conftest import TOKEN, run_client
from tests.iceberg_rest.tpch_queries import QUERIES, TABLES

pytestmark = pytest.mark.slow

SCALE = "0.1"
TPCHGEN_ENV = "tpchgen"
client_envs.ENVIRONMENTS.setdefault(TPCHGEN_ENV, ["tpchgen-cli==4.0.0"])


def _plain(table: pa.Table) -> pa.Table:
    """tpchgen's Parquet as arrowlake takes it: strings (not views), no foreign field ids."""
    fields = [pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type,
                       nullable=f.nullable) for f in table.schema]
    return table.cast(pa.schema(fields))


def _generate(folder: Path) -> dict[str, pa.Table]:
    python = client_envs.client_python(TPCHGEN_ENV)
    subprocess.run([str(python.parent / "tpchgen-cli"), "parquet", "-s", SCALE,
                    f"--output-dir={folder}"], check=True, capture_output=True, timeout=600)
    return {name: _plain(pq.read_table(folder / f"{name}.parquet")) for name in TABLES}


def _load(lake: al.Lake, data: dict[str, pa.Table]) -> None:
    lake.create_namespace("tpch")
    for name in ("lineitem", "orders", "partsupp", "supplier", "nation", "region"):
        table = lake.create_table(f"tpch.{name}", data[name].schema)
        rows = data[name]
        if name == "lineitem":
            half = rows.num_rows // 2
            table.append(rows.slice(0, half))
            table.append(rows.slice(half))
        else:
            table.append(rows)
    # customer: every balance off by 100, then the rows whose key is not a multiple of 3
    # upserted back as generated; a few customers deleted.
    customer = data["customer"]
    balance = customer.schema.field("c_acctbal")
    table = lake.create_table("tpch.customer", customer.schema, primary_key=["c_custkey"])
    table.upsert(customer.set_column(
        customer.schema.get_field_index("c_acctbal"), balance,
        pc.add(customer.column("c_acctbal"), pa.scalar(Decimal("100.00"), balance.type)
               ).cast(balance.type)))
    table.upsert(customer.filter(pa.array(customer.column("c_custkey").to_numpy() % 3 != 0)))
    table.delete("c_custkey > 14990")
    # part: prices doubled, then the even keys upserted back.
    part = data["part"]
    table = lake.create_table("tpch.part", part.schema, primary_key=["p_partkey"])
    price = part.schema.field("p_retailprice")
    table.upsert(part.set_column(part.schema.get_field_index("p_retailprice"), price,
                                 pc.multiply(part.column("p_retailprice"), 2).cast(price.type)))
    even = pc.equal(pc.bit_wise_and(part.column("p_partkey"), 1), 0)
    table.upsert(part.filter(even))


def _value(v: Any) -> Any:
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else float(f"{v:.10g}")
    if isinstance(v, Decimal):
        return v.normalize()
    return v


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    rows = [tuple(_value(v) for v in row.values()) for row in table.to_pylist()]
    return sorted(rows, key=repr)


@pytest.fixture(scope="module")
def tpch_run(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("tpch")
    data = _generate(work / "generated")
    lake = al.connect(work / "lake")
    _load(lake, data)
    views: dict[str, str] = {}
    for name in TABLES:  # the baseline: the same live rows, written by pyarrow
        path = work / "parquet" / f"{name}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(lake.table(f"tpch.{name}").to_arrow(), path)
        views[f"pq_{name}"] = str(path)
    queries = []
    for number, text in QUERIES.items():
        queries.append({"name": f"q{number:02d}_iceberg",
                        "sql": text.format(**{t: f"lake.tpch.{t}" for t in TABLES})})
        queries.append({"name": f"q{number:02d}_parquet",
                        "sql": text.format(**{t: f"pq_{t}" for t in TABLES})})
    with RunningCatalog(lake, port=0, tokens=[TOKEN], shutdown_timeout=5) as running:
        plan = {"uri": running.url, "token": TOKEN, "driver_memory": "2g",
                "package": client_envs.ICEBERG_SPARK_RUNTIME, "views": views,
                "queries": queries}
        run = run_client("spark41", "spark_client.py", plan, work / "spark", timeout=1800)
    yield run, lake
    lake.close()


@pytest.mark.timeout(1800)
def test_all_22_tpch_queries_give_the_parquet_readers_answers(tpch_run):
    """One test, because under pytest-xdist every worker that ran a test of this module
    would load the data and start its own Spark."""
    run, lake = tpch_run
    # The upserts left versions that the vectors choose between.
    assert lake.table("tpch.customer").count() == 14990
    assert lake.table("tpch.customer").files().num_rows >= 2
    assert lake.table("tpch.part").count() == 20000
    differ, failed = [], []
    for number in sorted(QUERIES):
        try:
            ours = run.table(f"q{number:02d}_iceberg")
            theirs = run.table(f"q{number:02d}_parquet")
        except AssertionError as exc:
            failed.append(f"Q{number}: {str(exc)[:1500]}")
            continue
        if ours.column_names != theirs.column_names or _rows(ours) != _rows(theirs):
            differ.append(f"Q{number}: {ours.num_rows} rows through the catalog, "
                          f"{theirs.num_rows} from Parquet\n{ours.slice(0, 5)}\n"
                          f"{theirs.slice(0, 5)}")
    assert not failed, "\n".join(failed)
    assert not differ, "\n\n".join(differ)
    empty = [n for n in QUERIES if run.table(f"q{n:02d}_parquet").num_rows == 0]
    assert len(empty) <= 1, f"queries without rows at this scale: {empty}"
