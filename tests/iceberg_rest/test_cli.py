"""``arrowlake iceberg-rest`` in its own process: the URL it prints, tokens, TLS, SIGTERM."""

from __future__ import annotations

import argparse
import contextlib
import re
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import requests

import arrowlake as al
from arrowlake.cli.main import main

TOKEN = "cli-token-77"


class Server:
    def __init__(self, lake_dir: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "arrowlake.cli.main", "--lake", str(lake_dir),
             "iceberg-rest", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        # Never wait forever for the URL: a server that does not start is killed, not leaked.
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        self.url = self.process.stdout.readline().strip() if ready else ""
        if not self.url:
            self.kill()
            raise AssertionError(f"no URL printed: {self.process.stderr.read()}")  # type: ignore[union-attr]

    def stop(self, timeout: float = 20) -> tuple[int, float]:
        """SIGTERM; the exit status and how long the exit took."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def lake_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "lake"
    with al.connect(folder) as lake:
        lake.create_namespace("crm")
        lake.create_table("crm.users", pa.schema([("id", pa.int64())])).append({"id": [1]})
    return folder


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.txt"
    path.write_text(f"# clients\n{TOKEN}\nother-token\n")
    return path


@pytest.fixture
def server(lake_dir: Path, token_file: Path) -> Iterator[Server]:
    running = Server(lake_dir, "--token-file", str(token_file), "--shutdown-timeout", "2s")
    yield running
    running.kill()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def _in_flight_load(url: str) -> threading.Thread:
    """A table load that waits: publishing its metadata needs the metastore, which another
    connection holds locked (see ``metastore_locked``)."""

    def load() -> None:
        with contextlib.suppress(requests.exceptions.RequestException):  # it exits under it
            requests.get(url + "/v1/namespaces/crm/tables/users", timeout=60,
                         headers={"Authorization": f"Bearer {TOKEN}"})

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    time.sleep(1.0)
    return thread


@contextlib.contextmanager
def metastore_locked(lake_dir: Path) -> Iterator[None]:
    """Another connection holds the metastore's write lock (started servers only: opening a
    lake writes)."""
    con = sqlite3.connect(lake_dir / "arrowlake.db", timeout=5, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        con.execute("ROLLBACK")
        con.close()


def test_prints_its_url_serves_with_tokens_and_stops_on_sigterm(server: Server):
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", server.url)
    for token in (TOKEN, "other-token"):
        ok = requests.get(server.url + "/v1/namespaces", timeout=30,
                          headers={"Authorization": f"Bearer {token}"})
        assert ok.json() == {"namespaces": [["crm"]]}
    refused = requests.get(server.url + "/v1/namespaces", timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == 401
    code, took = server.stop()
    assert code == 0 and took < 10


def test_sigterm_ends_a_request_in_flight_within_the_shutdown_timeout(
        server: Server, lake_dir: Path):
    with metastore_locked(lake_dir):
        _in_flight_load(server.url)
        code, took = server.stop()
    assert code == 1  # a request was still running: ended by exiting
    assert took < 2 + 5


def test_a_second_signal_exits_at_once(lake_dir: Path, token_file: Path):
    running = Server(lake_dir, "--token-file", str(token_file))  # 30 s to finish by default
    try:
        with metastore_locked(lake_dir):
            _in_flight_load(running.url)
            started = time.monotonic()
            running.process.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            assert running.process.poll() is None  # waiting for the request in flight
            running.process.send_signal(signal.SIGTERM)
            code = running.process.wait(10)
            assert code == 128 + signal.SIGTERM
            assert time.monotonic() - started < 10
    finally:
        running.kill()


def test_tls(lake_dir: Path, certificate: tuple[Path, Path]):
    cert, key = certificate
    running = Server(lake_dir, "--tls-cert", str(cert), "--tls-key", str(key),
                     "--shutdown-timeout", "2s")
    try:
        assert running.url.startswith("https://127.0.0.1:")
        answer = requests.get(running.url + "/v1/namespaces/crm/tables", verify=str(cert),
                              timeout=30)
        assert answer.json() == {"identifiers": [{"namespace": ["crm"], "name": "users"}]}
        refused = False
        try:
            requests.get(running.url.replace("https", "http") + "/v1/config", timeout=30)
        except requests.exceptions.ConnectionError:
            refused = True  # the exception is dropped here: it holds the socket open
        assert refused
        assert running.stop()[0] == 0
    finally:
        running.kill()


def _fails(capsys: pytest.CaptureFixture[str], lake_dir: Path, *args: str) -> str:
    """The command's error, run in this process (each check would otherwise pay a start)."""
    code = main(["--lake", str(lake_dir), "iceberg-rest", *args])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == ""
    assert "Traceback" not in err
    return err


def test_bad_options_are_clear_errors(lake_dir: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]):
    assert "TLS needs both" in _fails(capsys, lake_dir, "--port", "0", "--tls-cert", "x.pem")
    assert "is not a file" in _fails(capsys, lake_dir, "--port", "0", "--tls-cert", "x.pem",
                                     "--tls-key", "y.pem")
    assert "No such file" in _fails(capsys, lake_dir, "--port", "0", "--token-file",
                                    str(tmp_path / "missing.txt"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert "port is in use" in _fails(capsys, lake_dir, "--port", str(port))
    assert "65535" in _fails(capsys, lake_dir, "--port", "70000")
    assert "Invalid --name 'namespaces'" in _fails(capsys, lake_dir, "--port", "0", "--name",
                                                   "namespaces")


def test_the_default_port_is_the_servers():
    # The command keeps its own copy so that --help imports no web framework.
    from arrowlake.cli import iceberg_rest as command
    from arrowlake.iceberg_rest import DEFAULT_PORT

    assert command.DEFAULT_PORT == DEFAULT_PORT == 8181
    parser = argparse.ArgumentParser()
    command.add_parser(lambda name, func, help: parser)
    assert parser.parse_args([]).port == 8181
