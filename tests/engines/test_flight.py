"""Arrow Flight: ``arrowlake serve`` in its own process, clients in this one (and another)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import arrowlake as al
from tests.engines.conftest import EVENTS_SCHEMA, events_data, fill_append_table, fill_pk_table

TOKEN = "s3cret-token"
AUTH = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
SRC = str(Path(al.__file__).parent.parent)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


class Server:
    def __init__(self, lake_dir: Path, *extra: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "arrowlake.cli.main", "--lake", str(lake_dir), "serve",
             "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_env())
        assert self.process.stdout is not None
        self.location = self.process.stdout.readline().strip()
        assert self.location.startswith(("grpc://127.0.0.1:", "grpc+tls://127.0.0.1:")), \
            self.process.stderr.read()

    def client(self, **options: object) -> fl.FlightClient:
        return fl.connect(self.location, **options)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Server]]:
    """A lake with an append and a primary-key table, served with a token."""
    lake_dir = tmp_path_factory.mktemp("flight") / "lake"
    with al.connect(lake_dir) as lake:
        fill_append_table(lake)
        fill_pk_table(lake)
        lake.create_table("shop.sink", EVENTS_SCHEMA)
        lake.create_table("shop.keyed_sink", EVENTS_SCHEMA, primary_key=["id"], buckets=2)
        big = lake.create_table("shop.big", pa.schema([("v", pa.int64())]))
        big.append(pa.table({"v": np.arange(2_000_000, dtype=np.int64)}))
    tokens = lake_dir.parent / "tokens.txt"
    tokens.write_text(f"# one per line\n{TOKEN}\nanother\n")
    server = Server(lake_dir, "--token-file", str(tokens))
    yield lake_dir, server
    assert server.stop() == 0  # SIGTERM: a graceful shutdown, exit status 0


#: What pyarrow 26 appends to a NOT_FOUND, INVALID_ARGUMENT or UNIMPLEMENTED error (and to any
#: error of get_schema), once arrowlake has cut the traceback: pyarrow's callback frame and the
#: status class, nothing of the server.
PYARROW_DETAIL = re.compile(
    r'\. Detail: Python exception: Traceback \(most recent call last\):\n'
    r'  File "pyarrow/_flight\.pyx", line \d+, in pyarrow\._flight\.(?P<callback>_\w+)\n'
    r'arrowlake\.flight\.(?P<status>\w+Status)\n')


#: What pyarrow appends to the message of a Flight error class: the Flight code's name.
FLIGHT_DETAIL = re.compile(r"\. Detail: (Failed|Internal|Unavailable|Unauthorized|"
                           r"Unauthenticated|Cancelled|TimedOut)($|\. gRPC client debug context)")


def assert_no_server_traceback(message: str, callback: str | None = None) -> str:
    """The message without pyarrow's detail, asserting that the detail is only that."""
    text, detail, rest = message.partition(". Detail: ")
    assert SRC not in message and "arrowlake/" not in message, message
    if FLIGHT_DETAIL.search(detail + rest):
        return text
    if detail:
        found = PYARROW_DETAIL.match(detail + rest)
        assert found, message
        assert callback is None or found["callback"] == callback, message
        after = (detail + rest)[found.end():]
        # A Python client may add gRPC's own context: the same text again.
        assert after == "" or after.startswith(". gRPC client debug context"), message
    return text


def _command(**body: object) -> fl.FlightDescriptor:
    return fl.FlightDescriptor.for_command(json.dumps(body).encode())


def _read(client: fl.FlightClient, descriptor: fl.FlightDescriptor) -> pa.Table:
    info = client.get_flight_info(descriptor, AUTH)
    return pa.concat_tables([client.do_get(ep.ticket, AUTH).read_all() for ep in info.endpoints])


def test_a_primary_key_table_is_read_with_a_filter_like_to_arrow(served):
    lake_dir, server = served
    client = server.client()
    descriptor = _command(table="shop.orders", filter="x >= 100 and y > 0",
                          columns=["id", "y", "customer"], split_bytes=1)
    info = client.get_flight_info(descriptor, AUTH)
    assert len(info.endpoints) > 1  # one endpoint per split
    assert info.schema.names == ["id", "y", "customer"]
    got = _read(client, descriptor)
    with al.connect(lake_dir) as lake:
        expected = lake.table("shop.orders").scan(
            filter="x >= 100 and y > 0", columns=["id", "y", "customer"]).to_arrow()
    assert got.num_rows == expected.num_rows > 0
    assert got.sort_by("id").equals(expected.sort_by("id"))


def test_path_descriptors_snapshots_and_listing(served):
    lake_dir, server = served
    client = server.client()
    with al.connect(lake_dir) as lake:
        table = lake.table("shop.events")
        first = int(table.snapshots()["snapshot_id"][0].as_py())
        expected_then = table.scan(snapshot=first).to_arrow()
        expected_now = table.to_arrow()
    assert _read(client, fl.FlightDescriptor.for_path("shop", "events")).sort_by("id").equals(
        expected_now.sort_by("id"))
    assert _read(client, _command(table="shop.events", snapshot=first)).sort_by("id").equals(
        expected_then.sort_by("id"))
    listed = {tuple(i.descriptor.path): i.schema for i in client.list_flights(options=AUTH)}
    assert listed[(b"shop.events",)].names == EVENTS_SCHEMA.names
    assert {b"shop.orders", b"shop.big"} <= {p[0] for p in listed}


def test_do_put_appends_and_upserts_in_one_commit(served):
    lake_dir, server = served
    client = server.client()

    def put(descriptor: fl.FlightDescriptor, data: pa.Table) -> dict:
        writer, reader = client.do_put(descriptor, data.schema, AUTH)
        for batch in data.to_batches(max_chunksize=100):  # several messages, one commit
            writer.write_batch(batch)
        writer.done_writing()
        answer = json.loads(reader.read().to_pybytes())
        writer.close()
        return answer

    answer = put(fl.FlightDescriptor.for_path("shop.sink"), events_data(0, 450))
    assert answer["rows"] == 450
    put(_command(table="shop.keyed_sink", mode="upsert"), events_data(0, 300))
    changed = events_data(200, 300)
    put(_command(table="shop.keyed_sink", mode="upsert"),
        changed.set_column(2, "y", pa.array(np.full(300, -1, np.int32))))
    with al.connect(lake_dir) as lake:
        sink = lake.table("shop.sink")
        assert sink.snapshots().num_rows == 1
        assert sink.to_arrow().sort_by("id").equals(events_data(0, 450))
        keyed = lake.table("shop.keyed_sink")
        kinds = keyed.snapshots()["kind"].to_pylist()
        assert [k for k in kinds if k != "compact"] == ["upsert", "upsert"]
        rows = keyed.to_arrow().sort_by("id")
        assert rows["id"].to_pylist() == list(range(500))
        assert set(rows["y"].to_pylist()[200:]) == {-1}


def test_a_wrong_or_missing_token_is_refused(served):
    _, server = served
    client = server.client()
    wrong = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer nope")])
    for options in (wrong, fl.FlightCallOptions()):
        with pytest.raises(fl.FlightUnauthenticatedError, match="bearer token"):
            client.get_flight_info(fl.FlightDescriptor.for_path("shop.events"), options)
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(client.list_flights(options=options))
    with pytest.raises(fl.FlightUnauthenticatedError):
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("shop.sink"), EVENTS_SCHEMA,
                                  wrong)
        writer.write_table(events_data(0, 10))
        writer.close()


def test_errors_reach_the_client_with_our_message(served):
    _, server = served
    client = server.client()
    cases = [  # NOT_FOUND and INVALID_ARGUMENT (tests/engines/test_flight_errors.py has all)
        (_command(table="shop.missing"), pa.ArrowKeyError, "TableNotFound: .*shop.missing"),
        (_command(table="shop.events", filter="nope > 1"), pa.ArrowInvalid,
         "ColumnNotFound: .*nope"),
        (_command(table="shop.events", filter="x >"), pa.ArrowInvalid, "FilterSyntaxError"),
        (_command(tabel="shop.events"), pa.ArrowInvalid, r"Unknown keys \['tabel'\]"),
        (fl.FlightDescriptor.for_command(b"not json"), pa.ArrowInvalid,
         "must be a JSON object"),
    ]
    for descriptor, kind, message in cases:
        with pytest.raises(kind, match=message) as info:
            client.get_flight_info(descriptor, AUTH)
        assert_no_server_traceback(str(info.value))
    with pytest.raises(pa.ArrowInvalid, match="Unknown write mode 'merge'"):
        writer, _ = client.do_put(_command(table="shop.sink", mode="merge"), EVENTS_SCHEMA, AUTH)
        writer.write_table(events_data(0, 10))
        writer.close()


def test_the_server_survives_a_client_that_disconnects_mid_stream(served):
    _, server = served
    info = server.client().get_flight_info(_command(table="shop.big"), AUTH)
    (endpoint,) = info.endpoints
    # Another process starts reading the 2,000,000 rows and dies after the first batch.
    script = textwrap.dedent(f"""
        import os, pyarrow.flight as fl
        client = fl.connect({server.location!r})
        options = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer {TOKEN}")])
        reader = client.do_get(fl.Ticket({endpoint.ticket.ticket!r}), options)
        reader.read_chunk()
        print("read one batch", flush=True)
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=_env())
    assert done.stdout.strip() == "read one batch", done.stderr
    assert server.process.poll() is None
    # The server still answers, the same stream included.
    client = server.client()
    assert client.do_get(endpoint.ticket, AUTH).read_all().num_rows == 2_000_000
    assert _read(client, fl.FlightDescriptor.for_path("shop.events")).num_rows > 0


def test_serve_refuses_an_empty_token_file_and_a_missing_lake(tmp_path):
    lake_dir = tmp_path / "lake"
    al.connect(lake_dir).close()
    empty = tmp_path / "tokens.txt"
    empty.write_text("\n# nothing\n")
    cli = [sys.executable, "-m", "arrowlake.cli.main"]
    done = subprocess.run([*cli, "--lake", str(lake_dir), "serve", "--port", "0",
                           "--token-file", str(empty)], capture_output=True, text=True,
                          timeout=60, env=_env())
    assert done.returncode == 2 and "holds no tokens" in done.stderr
    done = subprocess.run([*cli, "--lake", str(tmp_path / "nowhere"), "serve", "--port", "0"],
                          capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == 2 and "No lake at" in done.stderr


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_with_a_certificate(tmp_path):
    lake_dir = tmp_path / "lake"
    with al.connect(lake_dir) as lake:
        expected = fill_append_table(lake, commits=2).to_arrow()
    cert, key = _self_signed(tmp_path)
    server = Server(lake_dir, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert server.location.startswith("grpc+tls://")
        client = server.client(tls_root_certs=cert.read_bytes())
        got = _read(client, fl.FlightDescriptor.for_path("shop.events"))
        assert got.sort_by("id").equals(expected.sort_by("id"))
        with pytest.raises(fl.FlightUnavailableError):  # plain text is not accepted
            fl.connect(server.location.replace("grpc+tls", "grpc")).get_flight_info(
                fl.FlightDescriptor.for_path("shop.events"))
    finally:
        assert server.stop() == 0


# -- issue 20 -------------------------------------------------------------------------------------


def _data_files(lake_dir: Path, name: str) -> list[Path]:
    with al.connect(lake_dir) as lake:
        return sorted(Path(lake.table(name).location).rglob("*.parquet"))


def _wait_until(condition: Any, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


_STREAMING_CLIENT = """
import sys, time, pyarrow as pa, pyarrow.flight as fl
location, token, command = sys.argv[1:4]
client = fl.connect(location)
options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
schema = pa.schema([("id", pa.int64())])
writer, _ = client.do_put(fl.FlightDescriptor.for_command(command.encode()), schema, options)
for i in range(5):
    writer.write_batch(pa.record_batch({"id": list(range(i * 1000, i * 1000 + 1000))},
                                       schema=schema))
print("sent", flush=True)
time.sleep(600)  # stalls until killed, without ending its stream
"""


def test_a01_interrupted_put_commits_nothing(served):
    lake_dir, server = served
    name = "shop.put_killed"
    with al.connect(lake_dir) as lake:  # every batch is flushed to its file as it arrives
        lake.create_table(name, pa.schema([("id", pa.int64())]),
                          properties={"write.buffer-size": "1"})
    client = subprocess.Popen(
        [sys.executable, "-c", _STREAMING_CLIENT, server.location, TOKEN,
         json.dumps({"table": name})], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "sent"
        assert _wait_until(lambda: _data_files(lake_dir, name))  # the put's files, uncommitted
    finally:
        client.kill()
        client.wait()
    # The server sees its stream end with the call cancelled: it deletes what it wrote.
    assert _wait_until(lambda: not _data_files(lake_dir, name)), _data_files(lake_dir, name)
    time.sleep(0.3)
    with al.connect(lake_dir) as lake:
        assert lake.table(name).snapshots().num_rows == 0
    assert server.process.poll() is None


def test_a01_a_put_past_its_deadline_commits_nothing(served):
    lake_dir, server = served
    client = server.client()
    schema = pa.schema([("id", pa.int64())])
    with al.connect(lake_dir) as lake:
        lake.create_table("shop.put_late", schema, properties={"write.buffer-size": "1"})
        lake.create_table("shop.put_late_keyed", schema, primary_key=["id"], buckets=1)
    for name in ("shop.put_late", "shop.put_late_keyed"):
        options = fl.FlightCallOptions(timeout=1.0, headers=AUTH.headers)
        writer, _ = client.do_put(_command(table=name), schema, options)
        with pytest.raises(fl.FlightError):  # the client learns that its put failed ...
            for i in range(40):
                writer.write_batch(pa.record_batch({"id": [i]}, schema=schema))
                time.sleep(0.05)
            writer.done_writing()
            writer.close()
        # ... and it did: nothing is committed, the files it wrote are deleted.
        assert _wait_until(lambda name=name: not _data_files(lake_dir, name)), name
        time.sleep(0.5)
        with al.connect(lake_dir) as lake:
            assert lake.table(name).snapshots().num_rows == 0, name


def test_a01_a_put_retried_with_its_commit_id_is_written_once(served):
    lake_dir, server = served
    client = server.client()
    data = events_data(0, 120)
    with al.connect(lake_dir) as lake:
        lake.create_table("shop.sink_once", EVENTS_SCHEMA)
    answers = []
    for _ in range(2):
        writer, reader = client.do_put(_command(table="shop.sink_once", commit_id="load-7"),
                                       data.schema, AUTH)
        writer.write_table(data)
        writer.done_writing()
        answers.append(json.loads(reader.read().to_pybytes()))
        writer.close()
    assert [(a["rows"], a["duplicate"]) for a in answers] == [(120, False), (0, True)]
    assert answers[0]["snapshot_id"] == answers[1]["snapshot_id"]
    with al.connect(lake_dir) as lake:
        assert lake.table("shop.sink_once").count() == 120
    with pytest.raises(pa.ArrowInvalid, match="commit_id"):
        writer, _ = client.do_put(_command(table="shop.sink_once", commit_id=7), data.schema,
                                  AUTH)
        writer.write_table(data)
        writer.close()


def test_a02_a_table_created_again_under_its_name_is_read_not_the_dropped_one(served):
    lake_dir, server = served
    client = server.client()
    schema = pa.schema([("id", pa.int64()), ("who", pa.string())])
    with al.connect(lake_dir) as lake:
        old = lake.create_table("shop.reborn", schema)
        first = old.append({"id": [1, 2, 3], "who": ["old"] * 3}).snapshot_id
    stale = client.get_flight_info(_command(table="shop.reborn", snapshot=first), AUTH)
    assert _read(client, _command(table="shop.reborn", snapshot=first))["who"].to_pylist() \
        == ["old"] * 3
    with al.connect(lake_dir) as lake:
        lake.drop_table("shop.reborn")
        new = lake.create_table("shop.reborn", schema)
        assert new.append({"id": [10], "who": ["new"]}).snapshot_id == first
    got = _read(client, _command(table="shop.reborn", snapshot=first))
    assert got.to_pydict() == {"id": [10], "who": ["new"]}
    for endpoint in stale.endpoints:  # the old table's tickets do not read the new table
        with pytest.raises(pa.ArrowKeyError, match="SnapshotNotFound"):
            client.do_get(endpoint.ticket, AUTH).read_all()
    # An expired snapshot is not served from the plans cached for it.
    fresh = client.get_flight_info(_command(table="shop.reborn", snapshot=first), AUTH)
    with al.connect(lake_dir) as lake:
        table = lake.table("shop.reborn")
        table.overwrite({"id": [11], "who": ["newer"]})
        table.expire_snapshots()
    with pytest.raises(pa.ArrowKeyError, match="^SnapshotNotFound: "):
        _read(client, _command(table="shop.reborn", snapshot=first))
    for endpoint in fresh.endpoints:
        with pytest.raises(pa.ArrowKeyError, match="SnapshotNotFound"):
            client.do_get(endpoint.ticket, AUTH).read_all()


def test_a10_empty_columns_give_the_rows_without_columns(served):
    lake_dir, server = served
    client = server.client()
    descriptor = _command(table="shop.events", columns=[])
    with al.connect(lake_dir) as lake:
        rows = lake.table("shop.events").count()
    info = client.get_flight_info(descriptor, AUTH)
    assert info.schema.names == []
    assert client.get_schema(descriptor, AUTH).schema.names == []
    parts = [client.do_get(ep.ticket, AUTH).read_all() for ep in info.endpoints]
    assert {p.column_names == [] for p in parts} == {True}
    assert sum(p.num_rows for p in parts) == rows  # (concat_tables drops rows of no columns)


def _serve_process(lake_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "arrowlake.cli.main", "--lake", str(lake_dir),
                           "serve", *extra], capture_output=True, text=True, timeout=60,
                          env=_env())


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return line


def test_a03_serve_reports_a_port_in_use_a_wrong_key_and_a_binary_token_file(tmp_path):
    lake_dir = tmp_path / "lake"
    al.connect(lake_dir).close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_error_line(_serve_process(lake_dir, "--port", str(port)))
    assert f"127.0.0.1:{port}" in line and "in use" in line
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cert, _ = _self_signed(tmp_path / "a")
    _, other_key = _self_signed(tmp_path / "b")
    line = _one_error_line(_serve_process(lake_dir, "--port", "0", "--tls-cert", str(cert),
                                          "--tls-key", str(other_key)))
    assert str(cert) in line and str(other_key) in line and "does not match" in line
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(b"\xff\xfe\x00secret\n")
    line = _one_error_line(_serve_process(lake_dir, "--port", "0", "--token-file", str(tokens)))
    assert str(tokens) in line and "UTF-8" in line


def _stalled_put(server: Server, table: str) -> fl.FlightStreamWriter:
    client = server.client()
    writer, _ = client.do_put(_command(table=table), pa.schema([("id", pa.int64())]))
    writer.write_batch(pa.record_batch({"id": [1]}))
    return writer


def test_a12_serve_cancels_calls_still_open_after_the_shutdown_timeout(tmp_path):
    lake_dir = tmp_path / "lake"
    with al.connect(lake_dir) as lake:
        lake.create_table("s.t", pa.schema([("id", pa.int64())]))
    server = Server(lake_dir, "--shutdown-timeout", "1s")
    writer = _stalled_put(server, "s.t")
    time.sleep(0.3)
    server.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert server.process.wait(timeout=20) == 1
    assert time.monotonic() - started >= 0.9  # the grace period was given
    assert "--shutdown-timeout" in server.process.stderr.read()
    with al.connect(lake_dir) as lake:
        assert lake.table("s.t").snapshots().num_rows == 0
    del writer


def test_a12_a_second_signal_stops_serve_at_once(tmp_path):
    lake_dir = tmp_path / "lake"
    with al.connect(lake_dir) as lake:
        lake.create_table("s.t", pa.schema([("id", pa.int64())]))
    server = Server(lake_dir)  # the default grace: 30 s
    writer = _stalled_put(server, "s.t")
    time.sleep(0.3)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert server.process.poll() is None  # waiting for the put
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(timeout=10) == 128 + signal.SIGINT
    del writer


def test_serve_lets_a_running_put_finish_after_sigterm(tmp_path):
    lake_dir = tmp_path / "lake"
    with al.connect(lake_dir) as lake:
        lake.create_table("s.t", pa.schema([("id", pa.int64())]))
    server = Server(lake_dir)
    writer = _stalled_put(server, "s.t")
    time.sleep(0.3)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    writer.write_batch(pa.record_batch({"id": [2]}))
    writer.done_writing()
    writer.close()
    assert server.process.wait(timeout=20) == 0
    with al.connect(lake_dir) as lake:
        assert sorted(lake.table("s.t").to_arrow()["id"].to_pylist()) == [1, 2]


# -- issue 31 -------------------------------------------------------------------------------------


def _put(client: fl.FlightClient, descriptor: fl.FlightDescriptor, data: pa.Table) -> dict:
    writer, reader = client.do_put(descriptor, data.schema, AUTH)
    writer.write_table(data)
    writer.done_writing()
    answer = json.loads(reader.read().to_pybytes())
    writer.close()
    return answer


@pytest.mark.parametrize("kind", ["append", "deletion-vectors", "merge-on-read"])
def test_a_repeated_commit_id_answers_no_rows_on_every_kind_of_table(served, kind):
    lake_dir, server = served
    name = f"shop.once_{kind.replace('-', '_')}"
    options: dict[str, Any] = {}
    if kind != "append":
        options = {"primary_key": ["id"], "buckets": 2,
                   "deletion_vectors": kind == "deletion-vectors"}
    with al.connect(lake_dir) as lake:
        table = lake.create_table(name, EVENTS_SCHEMA, **options)
        assert table.primary_key == ([] if kind == "append" else ["id"])
    mode = "append" if kind == "append" else "upsert"
    answers = [_put(server.client(), _command(table=name, mode=mode, commit_id="job-1"),
                    events_data(0, 5)) for _ in range(3)]
    assert [(a["rows"], a["duplicate"]) for a in answers] == [(5, False), (0, True), (0, True)]
    assert len({a["snapshot_id"] for a in answers}) == 1
    with al.connect(lake_dir) as lake:
        assert lake.table(name).count() == 5


def test_an_append_put_on_a_primary_key_table_upserts(served):
    lake_dir, server = served
    with al.connect(lake_dir) as lake:
        lake.create_table("shop.keyed_appends", EVENTS_SCHEMA, primary_key=["id"], buckets=2)
    client = server.client()
    first = events_data(0, 100)
    _put(client, _command(table="shop.keyed_appends", mode="append"),
         first.set_column(2, "y", pa.array(np.full(100, 1, np.int32))))
    second = events_data(50, 100)  # keys 50-99 again
    _put(client, fl.FlightDescriptor.for_path("shop.keyed_appends"),  # a path appends too
         second.set_column(2, "y", pa.array(np.full(100, 2, np.int32))))
    got = _read(client, fl.FlightDescriptor.for_path("shop.keyed_appends")).sort_by("id")
    assert got["id"].to_pylist() == list(range(150))  # each key once: upserted, not added
    assert got["y"].to_pylist() == [1] * 50 + [2] * 100


def test_a_table_of_many_files_is_served_as_several_endpoints(served):
    lake_dir, server = served
    with al.connect(lake_dir) as lake:
        table = lake.create_table("shop.many_files", pa.schema([("v", pa.int64())]))
        for i in range(40):
            table.append(pa.table({"v": np.arange(i * 5000, (i + 1) * 5000, dtype=np.int64)}))
        files = len(table.files())
    assert files == 40
    client = server.client()
    info = client.get_flight_info(fl.FlightDescriptor.for_path("shop.many_files"), AUTH)
    assert len(info.endpoints) >= 8  # MIN_ENDPOINTS: a client has as many to read at once
    with ThreadPoolExecutor(4) as pool:  # what a multi-threaded client does
        parts = list(pool.map(lambda ep: client.do_get(ep.ticket, AUTH).read_all(),
                              info.endpoints))
    got = pa.concat_tables(parts)["v"].to_numpy()
    assert np.array_equal(np.sort(got), np.arange(200_000))
    # split_bytes still decides when given: one endpoint of everything.
    one = client.get_flight_info(_command(table="shop.many_files", split_bytes=1 << 40), AUTH)
    assert len(one.endpoints) == 1
