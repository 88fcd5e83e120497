"""Item 3 of the defects issue: a lost reply to COMMIT must not make the retry commit twice."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pyarrow as pa
import pytest
import sqlalchemy as sa
import sqlalchemy.exc as sx

import arrowlake as al
import arrowlake.metastore.store as store
from tests.conftest import METASTORES, make_lake


def _lose_first_commit_reply(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the first commit reach the database and then fail as if its reply was lost."""
    real = store.Metastore._commit_once
    lost: list[int] = []

    def lost_ack(self, conn, *args):
        out = real(self, conn, *args)
        if not lost:
            lost.append(out[0])
            conn.commit()
            raise sx.OperationalError("COMMIT", {}, OSError("connection reset by peer"))
        return out

    monkeypatch.setattr(store.Metastore, "_commit_once", lost_ack)
    return lost


@pytest.mark.parametrize("kind", METASTORES)
def test_item3_lost_commit_reply_does_not_store_an_append_twice(kind, tmp_path, request,
                                                                monkeypatch):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    lost = _lose_first_commit_reply(monkeypatch)
    result = t.append({"id": [1, 2]})
    assert lost == [1]
    assert (result.snapshot_id, result.duplicate, result.added_rows) == (1, False, 2)
    assert result.attempts == 2
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]  # its file was kept
    assert t.snapshots().num_rows == 1
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item3_lost_reply_with_a_commit_id_is_a_success_and_a_resend_a_duplicate(
        kind, tmp_path, request, monkeypatch):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    _lose_first_commit_reply(monkeypatch)
    first = t.append({"id": [1]}, commit_id="batch-1")
    assert (first.snapshot_id, first.duplicate, first.added_files) == (1, False, 1)
    again = t.append({"id": [1]}, commit_id="batch-1")  # the user resends the same batch
    assert (again.snapshot_id, again.duplicate) == (1, True)
    assert t.to_arrow().column("id").to_pylist() == [1]
    assert len(t.files()) == 1
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item3_lost_reply_of_a_delete_is_not_reported_as_a_conflict(kind, tmp_path, request,
                                                                    monkeypatch):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1, 2, 3]})
    _lose_first_commit_reply(monkeypatch)
    # Without the token the retry would find its files already removed: CommitConflict.
    result = t.delete("id = 2")
    assert (result.snapshot_id, result.removed_rows) == (2, 1)
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 3]
    assert t.snapshots().num_rows == 2
    lake.close()


def test_item3_lost_reply_on_the_last_attempt_is_still_found(tmp_path, monkeypatch):
    """No retries left: the commit looks for its token once more before giving up (and
    before the writer deletes files a landed snapshot references)."""
    lake = al.connect(tmp_path / "lake", commit_retries=1)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    _lose_first_commit_reply(monkeypatch)
    result = t.append({"id": [1]})
    assert (result.snapshot_id, result.attempts, result.duplicate) == (1, 1, False)
    assert t.to_arrow().column("id").to_pylist() == [1]
    lake.close()


class _ReplyDroppingProxy:
    """A TCP proxy in front of PostgreSQL. Once armed, it passes on the COMMIT of the first
    transaction that inserted a snapshot row, gives the server time to commit it, and then cuts
    the connection before the reply reaches the client: a lost reply to COMMIT, for real."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = False
        self.fired = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            cut = threading.Event()
            threading.Thread(target=self._replies, args=(server, client, cut), daemon=True).start()
            threading.Thread(target=self._requests, args=(client, server, cut),
                             daemon=True).start()

    @staticmethod
    def _replies(server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if cut.is_set():
                    return
                client.sendall(data)
        with contextlib.suppress(OSError):
            client.close()

    def _requests(self, client: socket.socket, server: socket.socket,
                  cut: threading.Event) -> None:
        buffer = b""
        started = False  # before the startup message, packets carry no type byte
        inserted = False

        def take(n: int) -> bytes | None:
            nonlocal buffer
            while len(buffer) < n:
                data = client.recv(65536)
                if not data:
                    return None
                buffer += data
            out, buffer = buffer[:n], buffer[n:]
            return out

        with contextlib.suppress(OSError):
            while True:
                if not started:
                    head = take(4)
                    if head is None:
                        break
                    body = take(struct.unpack("!i", head)[0] - 4)
                    if body is None:
                        break
                    # SSLRequest and GSSENCRequest come before the real startup message.
                    started = struct.unpack("!i", body[:4])[0] not in (80877103, 80877104)
                    server.sendall(head + body)
                    continue
                head = take(5)
                if head is None:
                    break
                body = take(struct.unpack("!i", head[1:])[0] - 4)
                if body is None:
                    break
                if self.armed and b"INSERT INTO al_snapshots" in body:
                    inserted = True
                if self.armed and inserted and head[:1] in (b"Q", b"P") \
                        and body.lstrip(b"\0").upper().startswith(b"COMMIT"):
                    self.armed = False
                    cut.set()
                    server.sendall(head + body)
                    time.sleep(0.5)  # the server commits; its reply is dropped
                    self.fired.set()
                    break
                server.sendall(head + body)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.close()


def test_item3_lost_commit_reply_from_real_postgres_does_not_duplicate(pg_server, tmp_path):
    url = pg_server.create_database()
    parsed = sa.engine.make_url(url)
    proxy = _ReplyDroppingProxy(parsed.host or "127.0.0.1", parsed.port or 5432)
    proxied = parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(
        hide_password=False)
    lake = al.connect(proxied, warehouse=str(tmp_path / "wh"))
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    proxy.armed = True
    result = t.append({"id": [2]})
    assert proxy.fired.is_set()
    assert result.attempts >= 2 and not result.duplicate
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]
    assert t.snapshots().num_rows == 2
    lake.close()
    proxy.close()
