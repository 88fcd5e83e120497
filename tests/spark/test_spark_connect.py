"""The Spark section of the README from a Spark Connect client session.

One Connect server for the run (``spark-submit`` of PySpark's ``SparkConnectServer``, from the
wheel's jars, on a free loopback port; its Python workers import the arrowlake under test)
and one client process holding ``SparkSession.builder.remote(...)`` (see connect_client.py).
Results are compared with the classic session's of the other Spark tests.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from tests.spark import connect_client

pytest.importorskip("pyspark")
pytest.importorskip("grpc", reason="the Spark Connect client's packages are not installed")

import pyspark

import arrowlake.spark as als
from arrowlake.spark.s3a import has_s3a
from arrowlake.spark.session import has_class, is_connect

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all held open until all are chosen)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory):
    """A Spark Connect server in its own JVM, stopped at the end of the run."""
    spark_home = Path(pyspark.__file__).parent
    # The driver's and block manager's ports are set too: left random, one of them once took
    # the Connect port first, the readiness check below connected to it, and the Connect
    # service then failed to bind.
    port, driver_port, block_port = free_ports(3)
    src = str(Path(al.__file__).resolve().parent.parent)
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_CONNECT_MODE": "0",
           "PYTHONPATH": os.pathsep.join(
               [src, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
    conf = {"spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2", "spark.sql.session.timeZone": "UTC",
            "spark.driver.memory": "1g", "spark.python.worker.reuse": "true",
            "spark.driver.port": str(driver_port), "spark.blockManager.port": str(block_port)}
    log_path = tmp_path_factory.mktemp("connect") / "server.log"
    command = [str(spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS,
               "--master", "local[2]", "--name", "arrowlake-connect-tests"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the Connect server exited: {log_path.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the Connect server did not listen within 120 s: "
                                       f"{log_path.read_text()[-3000:]}") from None
                time.sleep(0.2)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, 15)  # the server's own process group (its Python workers too)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()


@pytest.fixture(scope="session")
def client(connect_url):
    """A process holding a Connect session; ``client.submit(fn, ...)`` runs a function of
    connect_client.py there."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=connect_client.start,
                             initargs=(connect_url,)) as pool:
        yield pool


def run(client, fn, *args, **kwargs):
    return client.submit(fn, *args, **kwargs).result(timeout=240)


SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.string()),
                    ("n", pa.int64())])


def rows(ids, day="d", n=0) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "day": [f"{day}{i % 3}" for i in ids], "n": [n] * len(ids)},
                    schema=SCHEMA)


def by_id(table: pa.Table) -> pa.Table:
    return table.sort_by("id")


def test_connect_session_is_told_apart_without_the_jvm(spark, client):
    module, connect = run(client, connect_client.session_kind)
    assert module.startswith("pyspark.sql.connect.") and connect
    assert not is_connect(spark)
    # The classic session here and the server run local[2]: the same parallelism.
    assert run(client, connect_client.parallelism) == spark.sparkContext.defaultParallelism == 2


def test_connect_client_asks_the_server_which_jvm_classes_it_has(spark, client):
    """S3A is looked for on the server (SQL's try_reflect), not taken as missing: a class of
    Spark's Hadoop is found, S3A (no hadoop-aws on this server) and a made-up class are not;
    the classic session's JVM answers the same."""
    names = ["org.apache.hadoop.fs.LocalFileSystem", "org.apache.hadoop.fs.s3a.S3AFileSystem",
             "org.example.arrowlake.NoSuchClass"]
    expected = dict(zip(names, [True, False, False], strict=True))
    assert run(client, connect_client.jvm_classes, names) == (False, expected)
    assert {name: has_class(spark, name) for name in names} == expected
    assert not has_s3a(spark)


# slow: about 40 s.
@pytest.mark.slow
def test_fast_path_over_connect_reads_what_the_classic_session_reads(spark, client,
                                                                    tmp_path):
    """Append table with an evolved schema, a primary-key table whose overlapping buckets are
    merged by the data source, and a deletion-vector table dropping its deleted rows by each
    of the three methods: same plan and same rows as the classic session."""
    path = str(tmp_path / "lake")
    lake = al.connect(path)
    a = lake.create_table("s.append", SCHEMA, partition_by=["day"])
    a.append(rows(range(300)))
    a.rename_column("n", "amount")
    a.add_column("note", pa.string())
    a.append(pa.table({"id": [1000], "day": ["d9"], "amount": [7], "note": ["x"]}))
    k = lake.create_table("s.k", SCHEMA, primary_key=["id"], buckets=4,
                          deletion_vectors=False)
    k.upsert(rows(range(400)))
    k.upsert(rows(range(1000, 1100)))
    k.upsert(rows(range(0, 40), n=9))
    k.delete("id = 7")
    dv = lake.create_table("s.dv", SCHEMA, primary_key=["id"], buckets=2,
                           deletion_vectors=True)
    dv.upsert(rows(range(600)))
    dv.upsert(rows(range(0, 600, 7), n=1))
    dv.delete("id >= 100 and id < 110")

    bitmap = {"LIST_DELETES": 0}
    join = {"LIST_DELETES": 0, "BITMAP_BYTES": 0, "BITMAP_MAX_BYTES": 0}
    cases = [("s.append", {"filter": "amount >= 0 and day in ('d1', 'd9')",
                           "columns": ["note", "id"]}, {}),
             ("s.k", {}, {}),
             ("s.dv", {}, {}),
             ("s.dv", {"filter": "id < 500", "columns": ["n", "id"]}, bitmap),
             ("s.dv", {}, join)]
    seen = set()
    for table, kwargs, limits in cases:
        got, described = run(client, connect_client.fast_read, path, table, limits, **kwargs)
        with pytest.MonkeyPatch.context() as patch:
            for name, value in limits.items():
                patch.setattr(als.fast, name, value)
            plan = als.plan_read(spark, lake, table, **kwargs)
            expected = plan.to_dataframe(spark).toArrow()
        assert described == plan.describe()
        assert got.schema == expected.schema
        assert by_id(got).equals(by_id(expected)), (table, kwargs)
        scan = lake.table(table).scan(kwargs.get("filter"), kwargs.get("columns"))
        assert got.num_rows == scan.count() > 0
        seen.update(m for m in ("NOT IN list", "bitmap", "anti-join", "must be merged")
                    if m in described)
    assert seen == {"NOT IN list", "bitmap", "anti-join", "must be merged"}


def test_format_reads_and_writes_over_connect(spark, client, tmp_path):
    path = str(tmp_path / "lake")
    lake = al.connect(path)
    users = lake.create_table("s.users", SCHEMA, primary_key=["id"], buckets=2)
    run(client, connect_client.register)  # not needed, but works over Connect too
    run(client, connect_client.format_write, path, "s.users", rows(range(100)))
    run(client, connect_client.format_write, path, "s.users", rows(range(90, 120), n=5),
        write="upsert")
    assert users.count() == 120 and users.scan("n = 5").count() == 30
    got = run(client, connect_client.format_read, path, "s.users", filter="id >= 95")
    expected = (spark.read.format("arrowlake").option("lake", path)
                .option("filter", "id >= 95").load("s.users").toArrow())
    assert by_id(got).equals(by_id(expected)) and got.num_rows == 25
    run(client, connect_client.format_write, path, "s.users", rows(range(3), n=1),
        mode="overwrite")
    assert by_id(users.to_arrow()).equals(rows(range(3), n=1))


# slow: a streaming query over Connect, about 45 s.
@pytest.mark.slow
def test_streaming_over_connect(client, tmp_path):
    """A streaming copy into the arrowlake sink and an update-mode aggregate through
    ``foreach_batch_sink``, which under Connect needs ``queryId`` (refused without one,
    the table left as it was)."""
    path = str(tmp_path / "lake")
    lake = al.connect(path)
    source = lake.create_table("s.events", SCHEMA)
    copy = lake.create_table("s.copy", SCHEMA)
    totals = lake.create_table("s.totals", pa.schema([pa.field("day", pa.string(), False),
                                                      ("total", pa.int64())]),
                               primary_key=["day"])
    source.append(rows(range(30), n=2))
    checkpoints = tmp_path / "checkpoints"
    run(client, connect_client.stream_copy, path, "s.events", "s.copy",
        str(checkpoints / "copy"))
    assert by_id(copy.to_arrow()).equals(by_id(source.to_arrow()))

    error = run(client, connect_client.sink_without_query_id, path, "s.totals",
                pa.table({"day": ["d0"], "total": [1]}))
    assert error.startswith("ValidationError: foreach_batch_sink under Spark Connect")
    assert "queryId" in error
    assert totals.count() == 0 and totals.refresh().current_snapshot_id is None

    run(client, connect_client.stream_totals, path, "s.events", "s.totals",
        str(checkpoints / "totals"), "daily-totals")
    assert totals.to_arrow().sort_by("day").to_pylist() == [
        {"day": "d0", "total": 20}, {"day": "d1", "total": 20}, {"day": "d2", "total": 20}]
    assert {r["commit_id"] for r in totals.history()} == {"spark-stream:daily-totals:0"}
