"""The real test services start, answer, and stop (tests/services.py)."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

try:
    from tests.services import (
        PostgresServer,
        S3Server,
        ServiceStartError,
        _port_open,
        start_postgres,
        start_s3,
    )
except ImportError:  # tests/ itself on sys.path (pytest rootdir-less "prepend" import)
    from services import (  # type: ignore[no-redef]
        PostgresServer,
        S3Server,
        ServiceStartError,
        _port_open,
        start_postgres,
        start_s3,
    )

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pg(tmp_path_factory) -> PostgresServer:
    server = start_postgres(tmp_path_factory.mktemp("pg"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3() -> S3Server:
    server = start_s3()
    yield server
    server.stop()


def _wait_closed(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _port_open("127.0.0.1", port):
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------ PostgreSQL


def test_postgres_answers_sql(pg):
    assert pg.url == f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/arrowlake"
    assert pg.is_running()
    assert pg.startup_seconds < 30
    engine = sa.create_engine(pg.url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
            assert conn.execute(sa.text("SELECT current_database()")).scalar() == "arrowlake"
            version = conn.execute(sa.text("SHOW server_version_num")).scalar()
            assert int(version) >= 160000
    finally:
        engine.dispose()


def test_postgres_not_running_as_root(pg):
    pid = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
    uid = os.stat(f"/proc/{pid}").st_uid if os.path.exists(f"/proc/{pid}") else os.getuid()
    if os.geteuid() == 0:
        assert uid != 0
    else:
        assert uid == os.geteuid()


def test_postgres_fresh_databases_are_isolated(pg):
    url_a = pg.create_database()
    url_b = pg.create_database("iso_b")
    assert url_b.endswith("/iso_b")
    ea, eb = sa.create_engine(url_a), sa.create_engine(url_b)
    try:
        with ea.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (id int PRIMARY KEY, v text)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1, 'a'), (2, 'b')"))
        with ea.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar() == 2
        with eb.connect() as conn:
            assert not sa.inspect(conn).has_table("t")
    finally:
        ea.dispose()
        eb.dispose()
    pg.drop_database("iso_b")
    with pytest.raises(sa.exc.OperationalError):
        sa.create_engine(url_b).connect()


def test_postgres_concurrent_connections_and_conflicts(pg):
    engine = sa.create_engine(pg.create_database(), pool_size=16, max_overflow=0)
    meta = sa.MetaData()
    snaps = sa.Table(
        "snapshots",
        meta,
        sa.Column("table_id", sa.Integer, primary_key=True),
        sa.Column("snapshot_id", sa.Integer, primary_key=True),
        sa.Column("writer", sa.Integer, nullable=False),
    )
    meta.create_all(engine)
    barrier = threading.Barrier(12)

    def commit(writer: int) -> bool:
        with engine.connect() as conn:
            barrier.wait()
            try:
                with conn.begin():
                    # every writer races for snapshot 1; also each adds its own row
                    conn.execute(
                        sa.insert(snaps).values(table_id=2, snapshot_id=writer, writer=writer)
                    )
                    conn.execute(sa.insert(snaps).values(table_id=1, snapshot_id=1, writer=writer))
                return True
            except sa.exc.IntegrityError:
                return False

    try:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(commit, range(12)))
        assert results.count(True) == 1  # exactly one writer wins the race
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(snaps.c.table_id, sa.func.count()).group_by(snaps.c.table_id)
            )
            counts = dict(rows.all())
            # the losers' whole transactions rolled back
            assert counts == {1: 1, 2: 1}
            active = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            ).scalar()
            assert active >= 1
    finally:
        engine.dispose()


def test_postgres_stops_cleanly(tmp_path):
    with start_postgres(tmp_path, dbname="solo") as server:
        assert server.url.endswith("/solo")
        engine = sa.create_engine(server.url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 41 + 1")).scalar() == 42
        engine.dispose()
        port = server.port
    assert not server.is_running()
    assert _wait_closed(port)
    server.stop()  # idempotent


def test_postgres_reports_failure_clearly(tmp_path):
    with pytest.raises(ServiceStartError, match=r"(?s)did not start.*unrecognized"):
        start_postgres(tmp_path, settings={"no_such_setting_xyz": "1"}, timeout=10)


# ------------------------------------------------------------------------- S3


def test_s3_round_trips_with_obstore(s3):
    assert s3.endpoint == f"http://127.0.0.1:{s3.port}"
    assert s3.create_bucket("roundtrip") == "roundtrip"
    store = s3.store("roundtrip")

    obstore.put(store, "dir/a.txt", b"hello world")
    obstore.put(store, "dir/b.txt", b"x" * 10)
    obstore.put(store, "other/c.txt", b"c")
    assert bytes(obstore.get(store, "dir/a.txt").bytes()) == b"hello world"
    assert bytes(obstore.get_range(store, "dir/a.txt", start=6, end=11)) == b"world"
    ranges = obstore.get_ranges(store, "dir/a.txt", starts=[0, 6], ends=[5, 11])
    assert [bytes(r) for r in ranges] == [b"hello", b"world"]
    suffix = obstore.get(store, "dir/a.txt", options={"range": {"suffix": 5}})
    assert bytes(suffix.bytes()) == b"world"  # the footer read: one suffix-range GET
    assert obstore.head(store, "dir/b.txt")["size"] == 10

    listed = sorted(m["path"] for batch in obstore.list(store, prefix="dir") for m in batch)
    assert listed == ["dir/a.txt", "dir/b.txt"]
    delim = obstore.list_with_delimiter(store)
    assert sorted(delim["common_prefixes"]) == ["dir", "other"]

    obstore.delete(store, "dir/a.txt")
    with pytest.raises(FileNotFoundError):
        obstore.get(store, "dir/a.txt")


def test_s3_multipart_and_conditional_puts(s3):
    s3.create_bucket("multipart")
    store = s3.store("multipart", prefix="lake")
    big = os.urandom(256 * 1024) * 48  # 12 MiB -> 3 parts of 5 MiB
    obstore.put(store, "big.bin", big, chunk_size=5 * 1024 * 1024, max_concurrency=4)
    meta = obstore.head(store, "big.bin")
    assert meta["size"] == len(big)
    assert meta["e_tag"].strip('"').endswith("-3")  # really was a multipart upload
    assert bytes(obstore.get_range(store, "big.bin", start=len(big) - 7, length=7)) == big[-7:]
    assert bytes(obstore.get(store, "big.bin").bytes()) == big

    first = obstore.put(store, "_commit", b"1", mode="create")
    with pytest.raises(obstore.exceptions.AlreadyExistsError):
        obstore.put(store, "_commit", b"2", mode="create")
    obstore.put(store, "_commit", b"3", mode={"e_tag": first["e_tag"]})
    with pytest.raises(obstore.exceptions.PreconditionError):
        obstore.put(store, "_commit", b"4", mode={"e_tag": first["e_tag"]})
    assert bytes(obstore.get(store, "_commit").bytes()) == b"3"


def test_s3_from_url_and_concurrent_async(s3):
    import asyncio

    from obstore.store import S3Store, from_url

    s3.create_bucket("fromurl")
    store = S3Store.from_url("s3://fromurl/pre", **s3.storage_options())
    generic = from_url("s3://fromurl/pre", **s3.storage_options())

    async def go():
        await asyncio.gather(*(obstore.put_async(store, f"k{i}", b"%d" % i) for i in range(32)))
        got = await asyncio.gather(*(obstore.get_async(generic, f"k{i}") for i in range(32)))
        return [bytes(await g.bytes_async()) for g in got]

    assert asyncio.run(go()) == [b"%d" % i for i in range(32)]
    raw = s3.store("fromurl")
    names = sorted(m["path"] for batch in obstore.list(raw) for m in batch)
    assert names == sorted(f"pre/k{i}" for i in range(32))


def test_s3_pyarrow_filesystem_reads(s3):
    s3.create_bucket("pyarrow")
    table = pa.table({"id": pa.array(range(1000), pa.int64()), "s": [str(i) for i in range(1000)]})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=100)
    obstore.put(s3.store("pyarrow"), "t/part-0.parquet", buf.getvalue())

    fs = s3.pyarrow_filesystem()
    info = fs.get_file_info("pyarrow/t/part-0.parquet")
    assert info.size == len(buf.getvalue())
    assert pq.read_table("pyarrow/t/part-0.parquet", filesystem=fs).equals(table)
    with fs.open_input_file("pyarrow/t/part-0.parquet") as f:
        assert f.read_at(4, len(buf.getvalue()) - 4) == b"PAR1"
    with fs.open_output_stream("pyarrow/t/by-pyarrow.txt") as out:
        out.write(b"written by pyarrow")
    got = obstore.get(s3.store("pyarrow"), "t/by-pyarrow.txt").bytes()
    assert bytes(got) == b"written by pyarrow"


def test_s3_reset_forgets_everything():
    with start_s3() as server:
        server.create_bucket("gone")
        obstore.put(server.store("gone"), "k", b"v")
        server.reset()
        with pytest.raises(Exception, match=r"(?i)bucket"):
            obstore.put(server.store("gone"), "k", b"v")


def test_s3_stops_cleanly():
    with start_s3() as server:
        assert server.is_running()
        server.create_bucket("stopme")
        port = server.port
    assert not server.is_running()
    assert _wait_closed(port)
    server.stop()  # idempotent


# ---------------------------------------------------------------- robustness


def test_services_die_with_their_parent(tmp_path):
    """A killed test process must not leave servers behind."""
    script = textwrap.dedent(
        f"""
        import json, pathlib, sys, time
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from tests.services import start_postgres, start_s3
        pg = start_postgres(pathlib.Path({str(tmp_path)!r}))
        s3 = start_s3()
        print(json.dumps([pg.port, s3.port]), flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        pg_port, s3_port = json.loads(line)
        assert _port_open("127.0.0.1", pg_port) and _port_open("127.0.0.1", s3_port)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert _wait_closed(pg_port, 20), "postgres outlived its parent"
    assert _wait_closed(s3_port, 20), "moto outlived its parent"
