"""Running the catalog: uvicorn on a socket we bind ourselves, and ``arrowlake iceberg-rest``.

The socket is bound before uvicorn starts, so a port in use or a wrong host is a clear
:class:`~arrowlake.errors.ArrowlakeError` (uvicorn would log it and exit the process), and
``port=0`` gives the port actually chosen. uvicorn runs on its own thread; the main thread
waits for SIGTERM/SIGINT, then lets requests in flight finish for ``shutdown_timeout`` seconds
and exits the process if some still run then (or at a second signal), as ``arrowlake serve``
does.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from arrowlake.errors import ArrowlakeError, ValidationError, require
from arrowlake.iceberg_rest.app import EXTRA, FEATURE, InFlight, build_app
from arrowlake.iceberg_rest.catalog import CatalogSettings
from arrowlake.lake import Lake

DEFAULT_PORT = 8181
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


def _check_tls(tls_cert: str | Path | None, tls_key: str | Path | None) -> None:
    if (tls_cert is None) != (tls_key is None):
        raise ValidationError("TLS needs both a certificate and its key (--tls-cert and "
                              "--tls-key)")
    if tls_cert is None or tls_key is None:
        return
    for what, path in (("certificate", tls_cert), ("key", tls_key)):
        if not Path(path).is_file():
            raise ValidationError(f"The TLS {what} {str(path)!r} is not a file")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            tls_cert, tls_key, password="")  # never prompt for an encrypted key's password
    except ssl.SSLError as err:
        why = "the key does not match the certificate" \
            if err.reason == "KEY_VALUES_MISMATCH" else f"{err.reason or err}"
        raise ValidationError(
            f"Cannot serve TLS with certificate {str(tls_cert)!r} and key {str(tls_key)!r}: "
            f"{why} (both must be PEM, the key the certificate's and not encrypted)") from None


def _bind(host: str, port: int) -> socket.socket:
    where = f"{host}:{port}"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise ArrowlakeError(
            f"Cannot listen on {where}: the host {host!r} is not an address of this machine "
            f"({err}); use 127.0.0.1, 0.0.0.0 or one of its addresses") from None
    except OverflowError:
        raise ArrowlakeError(f"Cannot listen on {where}: ports go from 0 to 65535") from None
    family, kind, proto, _, address = addresses[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ArrowlakeError(f"Cannot listen on {where}: the port is in use (another "
                                 "server?); choose another --port, or 0 for a free one") from None
        raise ArrowlakeError(f"Cannot listen on {where}: {err.strerror}") from None
    return sock


class RunningCatalog:
    """A catalog server running on a background thread (``url``, ``port``; ``stop()``)."""

    def __init__(self, lake: Lake, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                 tokens: Sequence[str] | None = None, tls_cert: str | Path | None = None,
                 tls_key: str | Path | None = None, settings: CatalogSettings | None = None,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
        uvicorn = require("uvicorn", EXTRA, FEATURE)
        if not 0 <= shutdown_timeout < float("inf"):
            raise ValidationError(f"The shutdown timeout must be 0 s or more, and finite; got "
                                  f"{shutdown_timeout}")
        _check_tls(tls_cert, tls_key)
        app = build_app(lake, settings, tokens)
        self._in_flight: InFlight = app.state.in_flight
        self.shutdown_timeout = shutdown_timeout
        self._socket = _bind(host, port)
        self.port: int = self._socket.getsockname()[1]
        scheme = "https" if tls_cert is not None else "http"
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{scheme}://{shown}:{self.port}"
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off",
            ssl_certfile=str(tls_cert) if tls_cert is not None else None,
            ssl_keyfile=str(tls_key) if tls_key is not None else None,
            timeout_graceful_shutdown=shutdown_timeout)
        self._server = uvicorn.Server(config)
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="iceberg-rest", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                self._socket.close()
                raise ArrowlakeError(f"The Iceberg REST catalog did not start on {self.url}: "
                                     f"{self._failure or 'see the log above'}")
            time.sleep(0.01)

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        except BaseException as exc:
            self._failure = exc

    @property
    def requests_in_flight(self) -> int:
        return self._in_flight.count

    def stop(self, timeout: float | None = None) -> bool:
        """Stop taking requests and wait up to the shutdown timeout for those in flight; True
        when all finished. Handlers still running then are not stopped (their threads cannot
        be): only the process's exit ends them."""
        self._server.should_exit = True
        limit = self.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        self._thread.join(limit + 1.0)
        while self._in_flight.count and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._thread.is_alive() and not self._in_flight.count

    def __enter__(self) -> RunningCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(lake: Lake, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
          tokens: Sequence[str] | None = None, tls_cert: str | Path | None = None,
          tls_key: str | Path | None = None, settings: CatalogSettings | None = None,
          out: TextIO | None = None,
          shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Serve ``lake``'s Iceberg REST catalog until SIGTERM or SIGINT.

    The first line written to ``out`` (stdout) is the URL clients use as ``uri``. After the
    signal no new connection is accepted and requests in flight get ``shutdown_timeout``
    seconds; if some still run then, or a second signal comes, the process exits at once
    (status 1, or 128 + the signal).
    """
    received: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) > 1:
            _exit_now(f"a second signal ({signal.Signals(signum).name}): exiting at once",
                      128 + signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        running = RunningCatalog(lake, host, port, tokens=tokens, tls_cert=tls_cert,
                                 tls_key=tls_key, settings=settings,
                                 shutdown_timeout=shutdown_timeout)
        out = out if out is not None else sys.stdout
        out.write(f"{running.url}\n")
        out.flush()
        while not received:
            time.sleep(0.2)
        sys.stderr.write(f"arrowlake iceberg-rest: shutting down; requests in flight have "
                         f"{shutdown_timeout:g} s to finish (a second signal exits at once)\n")
        sys.stderr.flush()
        if not running.stop():
            _exit_now(f"{running.requests_in_flight} request(s) still running "
                      f"{shutdown_timeout:g} s after the signal (--shutdown-timeout): "
                      "exiting, which ends them", 1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_now(why: str, status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is sys.stderr:
                stream.write(f"arrowlake iceberg-rest: {why}\n")
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
