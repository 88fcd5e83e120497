"""An Arrow Flight server over a lake: ``arrowlake serve``.

Any Arrow Flight client (C++, Java, Go, Rust, Python, ...) reads and writes tables:

- ``get_flight_info(descriptor)`` plans a scan and returns one endpoint per split. The
  descriptor is a command, JSON ``{"table": "shop.orders", "filter": "amount > 10",
  "columns": ["order_id"], "snapshot": 12, "split_bytes": 33554432}`` (all but ``table``
  optional), or a path (``["shop.orders"]`` or ``["shop", "orders"]``) for the whole table.
  Every endpoint reads the same snapshot (the current one unless ``snapshot`` is given).
  Without ``split_bytes`` there are at least :data:`MIN_ENDPOINTS` where the table's files
  allow, for clients that read endpoints in parallel.
- ``do_get(ticket)`` streams one endpoint's split. Tickets are JSON naming the scan and the
  split's files; the server re-plans from it (plans are cached), so tickets stay valid across
  server restarts while the snapshot lives.
- ``do_put(descriptor, stream)`` writes the stream in one commit: the command is JSON
  ``{"table": "...", "mode": "append"}`` (or ``"upsert"``; optional ``"commit_id"`` makes the
  put idempotent); a path appends. An append to a primary-key table upserts, as
  ``Table.append`` does. The server answers with one metadata message, JSON
  ``{"snapshot_id": ..., "rows": ..., "duplicate": ..., "table": ...}`` (a repeated
  ``commit_id`` answers ``"rows": 0, "duplicate": true``). A put commits all of its stream or
  nothing: a stream that ends because the client cancelled, disconnected or ran out of time
  (gRPC ends the server's reader cleanly then, and marks the call cancelled) commits nothing,
  and the files written for it are deleted.
- ``list_flights()`` lists the tables with their schemas; ``get_schema`` gives one. There are
  no actions.

Optional bearer-token authentication (``Authorization: Bearer <token>``, tokens one per line
in a file), TLS with a certificate and key, and errors that reach the client with the gRPC
status of their class (``ArrowlakeError.grpc_status``: ``NOT_FOUND``, ``INVALID_ARGUMENT``,
...), the message ``"<class>: <message>"`` and the class in the trailer ``arrowlake-error``
(see "errors" below for what pyarrow appends). SIGTERM and SIGINT shut the server down
gracefully: new calls are refused and running ones have a grace period to finish; calls still
open after it, or when a second signal comes, are cancelled by exiting the process.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO, TypeVar

import pyarrow as pa

from arrowlake.errors import ArrowlakeError, NotFound, SnapshotNotFound, ValidationError, require
from arrowlake.lake import Lake
from arrowlake.scan.scan import Scan
from arrowlake.scan.split import Split
from arrowlake.table import staged

__all__ = ["DEFAULT_PORT", "ScanRequest", "read_tokens", "serve", "server"]

DEFAULT_PORT = 8815
DEFAULT_SHUTDOWN_TIMEOUT = 30.0  # seconds running calls get after SIGTERM/SIGINT
_SCAN_KEYS = {"table", "filter", "columns", "snapshot", "split_bytes"}
_PUT_KEYS = {"table", "mode", "commit_id"}
_PUT_MODES = ("append", "upsert")
_PLAN_CACHE = 64  # plans kept for do_get
#: Without ``split_bytes``, a scan is cut into at least this many endpoints where its files (or
#: primary-key buckets) allow, so that a client reading endpoints on threads uses its cores.
MIN_ENDPOINTS = 8


def _flight() -> Any:
    return require("pyarrow.flight", "flight", "arrowlake serve (Arrow Flight)")


# -- requests -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScanRequest:
    """What a ``get_flight_info`` command asks for (hashable: the plan cache's key)."""

    table: str
    filter: str | None = None
    columns: tuple[str, ...] | None = None
    snapshot: int | None = None
    split_bytes: int | None = None

    def column_list(self) -> list[str] | None:
        """The projection as ``scan`` takes it: ``[]`` is rows without columns, None all."""
        return None if self.columns is None else list(self.columns)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"table": self.table}
        if self.filter is not None:
            out["filter"] = self.filter
        if self.columns is not None:
            out["columns"] = list(self.columns)
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot
        if self.split_bytes is not None:
            out["split_bytes"] = self.split_bytes
        return out


def _json_object(raw: bytes, what: str, allowed: set[str]) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError(f"The {what} must be a JSON object, like "
                              f'{{"table": "shop.orders"}}: {exc}') from None
    if not isinstance(value, dict):
        raise ValidationError(f"The {what} must be a JSON object, got {type(value).__name__}")
    unknown = set(value) - allowed
    if unknown:
        raise ValidationError(f"Unknown keys {sorted(unknown)} in the {what}; allowed: "
                              f"{sorted(allowed)}")
    if not isinstance(value.get("table"), str):
        raise ValidationError(f'The {what} needs "table": "namespace.table"')
    return value


def _optional(value: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    got = value.get(key)
    if got is not None and (not isinstance(got, kind) or isinstance(got, bool)):
        raise ValidationError(f'"{key}" has the wrong type ({type(got).__name__})')
    return got


def scan_request(raw: bytes) -> ScanRequest:
    """A command's JSON as a :class:`ScanRequest`."""
    value = _json_object(raw, "scan command", _SCAN_KEYS)
    columns = _optional(value, "columns", list)
    if columns is not None and not all(isinstance(c, str) for c in columns):
        raise ValidationError('"columns" must be a list of column names')
    return ScanRequest(value["table"], _optional(value, "filter", str),
                       tuple(columns) if columns is not None else None,
                       _optional(value, "snapshot", int), _optional(value, "split_bytes", int))


def _path_table(path: Sequence[bytes | str]) -> str:
    parts = [p.decode("utf-8") if isinstance(p, bytes) else p for p in path]
    if len(parts) in (1, 2):
        return ".".join(parts)
    raise ValidationError(f"A path descriptor names a table: ['ns.table'] or ['ns', 'table'], "
                          f"got {parts}")


def read_tokens(path: str | Path) -> list[str]:
    """The bearer tokens in a file: one per line; blank lines and ``#`` comments are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValidationError(f"The token file {str(path)!r} is not UTF-8 text (byte "
                              f"{exc.start}): write one token per line as text") from None
    tokens = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not tokens:
        raise ValidationError(f"The token file {str(path)!r} holds no tokens (one per line)")
    return tokens


# -- errors ---------------------------------------------------------------------------------------
#
# What pyarrow 26 lets a Python Flight server send (python/pyarrow/_flight.pyx, and
# cpp/src/arrow/flight/transport.cc and transport/grpc/util_internal.cc):
#
# - A Flight error class raised in a handler is sent as it is: its message, its ``extra_info``
#   (trailer ``grpc-status-details-bin``) and its code: FlightServerError UNKNOWN,
#   FlightInternalError INTERNAL, FlightUnavailableError UNAVAILABLE, FlightUnauthorizedError
#   PERMISSION_DENIED, FlightUnauthenticatedError UNAUTHENTICATED, FlightCancelledError
#   CANCELLED, FlightTimedOutError DEADLINE_EXCEEDED. No Flight class gives NOT_FOUND,
#   INVALID_ARGUMENT or UNIMPLEMENTED, and get_schema's callback does not handle Flight errors
#   at all (they arrive as UNKNOWN, with a traceback).
# - Any other exception becomes an Arrow status by its Python type (KeyError NOT_FOUND,
#   ValueError INVALID_ARGUMENT, NotImplementedError UNIMPLEMENTED, others UNKNOWN; no type
#   gives ALREADY_EXISTS), and pyarrow appends its formatted traceback to the message
#   (". Detail: Python exception: Traceback ..."), frames, file paths and source lines included.
#   Middleware hears of the error before that text is formatted: _TracebackTrimmer cuts the
#   traceback after pyarrow's own callback frame, so what is appended names pyarrow's callback
#   and the error's status class, and nothing of the server.

_R = TypeVar("_R")
ERROR_TRAILER = "arrowlake-error"  # every error's arrowlake class name, as a trailer


class ErrorStatus(Exception):
    """An arrowlake error on its way to a Flight client with a status code that pyarrow sends
    only for Python's own exception types (the subclasses); ``UnknownStatus`` is UNKNOWN."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.trimmed = False

    def __str__(self) -> str:
        # Once the message has been taken, the appended detail need not repeat it.
        return "" if self.trimmed else str(self.args[0])


class NotFoundStatus(ErrorStatus, KeyError):
    pass


class InvalidArgumentStatus(ErrorStatus, ValueError):
    pass


class UnimplementedStatus(ErrorStatus, NotImplementedError):
    pass


class UnknownStatus(ErrorStatus):
    pass


_PYTHON_STATUSES: dict[str, type[ErrorStatus]] = {
    "NOT_FOUND": NotFoundStatus,
    "INVALID_ARGUMENT": InvalidArgumentStatus,
    "UNIMPLEMENTED": UnimplementedStatus,
}


def _flight_statuses() -> dict[str, type]:
    fl = _flight()
    return {"UNKNOWN": fl.FlightServerError, "INTERNAL": fl.FlightInternalError,
            "UNAVAILABLE": fl.FlightUnavailableError,
            "PERMISSION_DENIED": fl.FlightUnauthorizedError,
            "UNAUTHENTICATED": fl.FlightUnauthenticatedError,
            "CANCELLED": fl.FlightCancelledError, "DEADLINE_EXCEEDED": fl.FlightTimedOutError}


def grpc_status(exc: BaseException) -> str:
    """The gRPC status code ``arrowlake serve`` answers ``exc`` with."""
    if isinstance(exc, ArrowlakeError):
        return exc.grpc_status
    return "INTERNAL"  # not an error of arrowlake's: a defect of the server


def _flight_error(exc: BaseException, context: Any = None, *,
                  flight_classes: bool = True) -> BaseException:
    """The error a client receives for ``exc``: the message ``"<class>: <message>"``, the
    class name in trailer ``arrowlake-error`` (and in ``extra_info`` where a Flight error class
    carries the code), and the status code of :func:`grpc_status`, without the server's
    traceback. ``flight_classes=False`` for callbacks that do not handle Flight errors."""
    name = type(exc).__name__
    message = f"{name}: {exc}"
    if context is not None:
        context.add_trailer(ERROR_TRAILER, name)
    code = grpc_status(exc)
    if code in _PYTHON_STATUSES:
        return _PYTHON_STATUSES[code](message)
    if not flight_classes:
        return UnknownStatus(message)
    return _flight_statuses()[code](message, name.encode())


def _answering(func: Callable[..., _R]) -> Callable[..., _R]:
    """Turns the errors a handler raises into the errors its client should see."""
    flight_classes = func.__name__ != "get_schema"  # pyarrow's get_schema callback lacks them

    def handler(self: Any, context: Any, *args: Any) -> _R:
        fl = _flight()
        try:
            return func(self, context, *args)
        except (fl.FlightError, ErrorStatus):
            raise
        except Exception as exc:
            raise _flight_error(exc, context, flight_classes=flight_classes) from None

    handler.__name__ = func.__name__
    handler.__doc__ = func.__doc__
    return handler


def _streamed(split: Split, context: Any) -> Iterator[pa.RecordBatch]:
    """The split's batches; an error while streaming reaches the client like any other."""
    try:
        yield from split.to_batches()
    except Exception as exc:
        raise _flight_error(exc, context) from None


def _trim(exception: BaseException) -> None:
    """Cut ``exception``'s traceback after pyarrow's callback frame (see above)."""
    tb = exception.__traceback__
    while tb is not None and tb.tb_next is not None:
        below = tb.tb_next
        if not below.tb_frame.f_globals.get("__name__", "").startswith("pyarrow"):
            tb.tb_next = None
            return
        tb = below


# -- the server -----------------------------------------------------------------------------------


class _Plans:
    """Planned splits, for ``do_get`` (least recently used are dropped).

    Keyed by table id, never reused, and not by name: a table dropped and created again
    under its name restarts snapshot ids. Each call still resolves the table and its snapshot
    (``Table.scan`` raises ``TableNotFound`` and ``SnapshotNotFound``: metadata lookups), so
    the cache only saves listing and pruning the files.
    """

    def __init__(self, lake: Lake, size: int = _PLAN_CACHE) -> None:
        self.lake = lake
        self.size = size
        self._plans: OrderedDict[tuple[int, ScanRequest], list[Split]] = OrderedDict()
        self._lock = threading.Lock()

    def plan(self, request: ScanRequest) -> tuple[ScanRequest, pa.Schema, list[Split]]:
        """The request pinned to a snapshot, the scan's schema and its splits."""
        table = self.lake.table(request.table)
        scan = table.scan(request.filter, request.column_list(), snapshot=request.snapshot)
        pinned = replace(request, snapshot=scan.snapshot_id)
        if pinned.snapshot is None:  # no snapshot yet: nothing to cache
            return pinned, scan.schema, _plan(scan, request)
        key = (table._record.table_id, pinned)
        with self._lock:
            splits = self._plans.get(key)
            if splits is not None:
                self._plans.move_to_end(key)
                return pinned, scan.schema, splits
        splits = _plan(scan, request)
        with self._lock:
            self._plans[key] = splits
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)
        return pinned, scan.schema, splits


def _plan(scan: Scan, request: ScanRequest) -> list[Split]:
    """The scan's splits: of ``split_bytes`` if asked, else the table's split size cut smaller
    until there are :data:`MIN_ENDPOINTS` (deterministic: do_get plans again from tickets)."""
    return scan.plan(request.split_bytes, min_splits=MIN_ENDPOINTS)


def _put_request(descriptor: Any) -> tuple[str, str, str | None]:
    """The table, write mode and commit id a ``do_put`` descriptor asks for."""
    fl = _flight()
    if descriptor.descriptor_type != fl.DescriptorType.CMD:
        return _path_table(descriptor.path), "append", None
    body = _json_object(descriptor.command, "write command", _PUT_KEYS)
    mode = body.get("mode", "append")
    if mode not in _PUT_MODES:
        raise ValidationError(f"Unknown write mode {mode!r}; use one of {', '.join(_PUT_MODES)}")
    return body["table"], mode, _optional(body, "commit_id", str)


def _check_not_cancelled(context: Any) -> None:
    if context.is_cancelled():
        raise _flight().FlightCancelledError(
            "The put was cancelled (the client disconnected, cancelled the call or ran past "
            "its deadline) before its stream ended; nothing was committed")


def _whole_stream(reader: Any, context: Any) -> Iterator[pa.RecordBatch]:
    """The batches a ``do_put`` client sends, raising instead of ending if the stream is cut.

    pyarrow's reader ends cleanly both when the client finishes its stream and when the call
    dies under it (client killed, connection lost, deadline passed, call cancelled); only the
    call's cancelled flag tells these apart. It was set by the time the read ended in every
    trial (killed clients, expired deadlines), and it is checked again before the commit.
    """
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            _check_not_cancelled(context)
            return
        if chunk.data is not None:
            yield chunk.data


def _ticket(request: ScanRequest, split: Split) -> bytes:
    body = request.to_json()
    body["files"] = [f.file_id for f in split.files]
    return json.dumps(body, separators=(",", ":")).encode()


def _server_class() -> type:
    fl = _flight()

    class TokenAuth(fl.ServerMiddlewareFactory):  # type: ignore[name-defined]
        """Refuses calls without ``Authorization: Bearer <one of the tokens>``."""

        def __init__(self, tokens: Sequence[str]) -> None:
            super().__init__()
            self.tokens = [t.encode() for t in tokens]

        def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
            for value in headers.get("authorization", []):
                text = value.decode() if isinstance(value, bytes) else str(value)
                scheme, _, token = text.partition(" ")
                if scheme.lower() == "bearer" and any(
                        hmac.compare_digest(token.strip().encode(), t) for t in self.tokens):
                    return None
            raise fl.FlightUnauthenticatedError(
                "A valid bearer token is required: send the header 'authorization: Bearer "
                "<token>' with one of the server's tokens")

    class TracebackTrimmer(fl.ServerMiddleware):  # type: ignore[name-defined]
        """Cuts the traceback pyarrow would send with an ``ErrorStatus`` (see "errors")."""

        def call_completed(self, exception: BaseException | None) -> None:
            if isinstance(exception, ErrorStatus):
                _trim(exception)
                exception.trimmed = True

    class TrimTracebacks(fl.ServerMiddlewareFactory):  # type: ignore[name-defined]
        def start_call(self, info: Any, headers: dict[str, list[Any]]) -> Any:
            return TracebackTrimmer()

    class LakeFlightServer(fl.FlightServerBase):  # type: ignore[name-defined]
        """Serves the tables of one lake (see the module docs)."""

        def __init__(self, lake: Lake, location: str, tokens: Sequence[str] | None = None,
                     tls_certificates: Sequence[tuple[bytes, bytes]] | None = None) -> None:
            middleware: dict[str, Any] = {"errors": TrimTracebacks()}
            if tokens:
                middleware["auth"] = TokenAuth(tokens)
            super().__init__(location, middleware=middleware,
                             tls_certificates=list(tls_certificates or []))
            self.lake = lake
            self.plans = _Plans(lake)

        def _request(self, descriptor: Any) -> ScanRequest:
            if descriptor.descriptor_type == fl.DescriptorType.CMD:
                return scan_request(descriptor.command)
            return ScanRequest(_path_table(descriptor.path))

        @_answering
        def get_flight_info(self, context: Any, descriptor: Any) -> Any:
            pinned, schema, splits = self.plans.plan(self._request(descriptor))
            endpoints = [fl.FlightEndpoint(_ticket(pinned, s), []) for s in splits]
            return fl.FlightInfo(schema, descriptor, endpoints, -1,
                                 sum(s.size_bytes for s in splits))

        @_answering
        def get_schema(self, context: Any, descriptor: Any) -> Any:
            request = self._request(descriptor)
            table = self.lake.table(request.table)
            scan = table.scan(request.filter, request.column_list(), snapshot=request.snapshot)
            return fl.SchemaResult(scan.schema)

        @_answering
        def do_get(self, context: Any, ticket: Any) -> Any:
            body = _json_object(ticket.ticket, "ticket", _SCAN_KEYS | {"files"})
            files = body.pop("files", None)
            if not isinstance(files, list):
                raise ValidationError("The ticket names no files; use the tickets "
                                      "get_flight_info returns")
            request = scan_request(json.dumps(body).encode())
            if request.snapshot is None:  # a table with no snapshot yet: nothing to read
                return fl.RecordBatchStream(self.plans.plan(request)[1].empty_table())
            _, schema, splits = self.plans.plan(request)
            for split in splits:
                if [f.file_id for f in split.files] == files:
                    # A generator stream, not a reader over the generator: an error it raises
                    # then passes pyarrow's callback frame, where TracebackTrimmer cuts.
                    return fl.GeneratorStream(schema, _streamed(split, context))
            raise SnapshotNotFound(
                f"The ticket's split of '{request.table}' is not in snapshot "
                f"{request.snapshot} any more (expired?); call get_flight_info again")

        @_answering
        def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
            name, mode, commit_id = _put_request(descriptor)
            table = self.lake.table(name)
            table._check_write(commit_id)
            if mode == "upsert" and not table.primary_key:
                raise ValidationError(f"Write mode 'upsert' needs a table with a primary key; "
                                      f"'{table.name}' has none. Use 'append'")
            batches = _whole_stream(reader, context)
            if table.primary_key:
                # Runs are sorted, so an upsert holds its input anyway: take it all, then write.
                rows = pa.Table.from_batches(list(batches), schema=reader.schema)
                _check_not_cancelled(context)
                result = table.upsert(rows, commit_id=commit_id)
            else:
                target = staged.write_target(table.state)
                stage = staged.stage(target, pa.RecordBatchReader.from_batches(
                    reader.schema, batches))  # deletes what it wrote if the stream breaks
                if context.is_cancelled():
                    staged.discard_staged(target, [stage])
                    _check_not_cancelled(context)
                result = staged.commit_staged(table.state, [stage], commit_id=commit_id)
            # A duplicate wrote nothing (upserts of deletion-vector tables report the rows
            # they would have written).
            rows = 0 if result.duplicate else result.added_rows
            answer = {"snapshot_id": result.snapshot_id, "rows": rows,
                      "duplicate": result.duplicate, "table": table.name}
            writer.write(pa.py_buffer(json.dumps(answer).encode()))

        @_answering
        def list_flights(self, context: Any, criteria: bytes) -> list[Any]:
            # A list, not a generator: pyarrow iterates outside this wrapper, where an error
            # would reach the client with the server's traceback.
            flights = []
            for name in self.lake.tables():
                try:
                    schema = self.lake.table(name).schema
                except NotFound:  # dropped meanwhile
                    continue
                descriptor = fl.FlightDescriptor.for_path(name)
                flights.append(fl.FlightInfo(schema, descriptor, [], -1, -1))
            return flights

        @_answering
        def list_actions(self, context: Any) -> list[tuple[str, str]]:
            return []  # no actions (pyarrow's default raises, with a traceback)

        @_answering
        def do_action(self, context: Any, action: Any) -> Iterator[Any]:
            raise UnimplementedStatus(
                f"arrowlake serve has no actions (asked for {action.type!r}); it serves "
                "get_flight_info, get_schema, do_get, do_put and list_flights")

    return LakeFlightServer


def server(lake: Lake, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
           tokens: Sequence[str] | None = None, tls_cert: str | Path | None = None,
           tls_key: str | Path | None = None) -> Any:
    """A running Flight server over ``lake`` (``port=0`` picks a free port: see ``.port``)."""
    if (tls_cert is None) != (tls_key is None):
        raise ValidationError("TLS needs both a certificate and its key (--tls-cert and "
                              "--tls-key)")
    certificates = None
    scheme = "grpc+tcp"
    if tls_cert is not None and tls_key is not None:
        certificates = [(Path(tls_cert).read_bytes(), Path(tls_key).read_bytes())]
        scheme = "grpc+tls"
    try:
        return _server_class()(lake, f"{scheme}://{host}:{port}", tokens=tokens,
                               tls_certificates=certificates)
    except pa.ArrowException as exc:  # gRPC logs the cause; pyarrow says "did not start"
        raise ArrowlakeError(_why_not_started(host, port, tls_cert, tls_key, exc)) from None


def _why_not_started(host: str, port: int, tls_cert: str | Path | None,
                     tls_key: str | Path | None, exc: Exception) -> str:
    """Why a Flight server could not start, found out again with the standard library."""
    where = f"{host}:{port}"
    if tls_cert is not None and tls_key is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
                tls_cert, tls_key, password="")  # never prompt for an encrypted key's password
        except ssl.SSLError as err:
            why = "the key does not match the certificate" \
                if err.reason == "KEY_VALUES_MISMATCH" else f"{err.reason or err}"
            return (f"Cannot serve TLS with certificate {str(tls_cert)!r} and key "
                    f"{str(tls_key)!r}: {why} (both must be PEM, the key the certificate's "
                    "and not encrypted)")
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        return (f"Cannot listen on {where}: the host {host!r} is not an address of this "
                f"machine ({err}); use 127.0.0.1, 0.0.0.0 or one of its addresses")
    except OverflowError:
        return f"Cannot listen on {where}: ports go from 0 to 65535"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    return (f"Cannot listen on {where}: the port is in use (another server?); "
                            "choose another --port, or 0 for a free one")
                return f"Cannot listen on {where}: {err.strerror}"
    return f"Cannot serve on {where}: {exc}"


def serve(lake: Lake, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
          tokens: Sequence[str] | None = None, tls_cert: str | Path | None = None,
          tls_key: str | Path | None = None, out: TextIO | None = None,
          shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Serve ``lake`` until SIGTERM or SIGINT, then shut down gracefully.

    The first line written to ``out`` (stdout) is the location clients connect to. After the
    signal new calls are refused and running ones get ``shutdown_timeout`` seconds to finish;
    if some are still open then, or a second SIGTERM/SIGINT arrives, the process exits at once
    (``os._exit``: status 1, or 128 + the signal), which cancels them. pyarrow offers no other
    way to end a call whose client stalls.
    """
    if not 0 <= shutdown_timeout < float("inf"):
        raise ValidationError(f"The shutdown timeout must be 0 s or more, and finite; got "
                              f"{shutdown_timeout}")
    running = server(lake, host, port, tokens=tokens, tls_cert=tls_cert, tls_key=tls_key)
    received: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) > 1:
            _exit_now(f"a second signal ({signal.Signals(signum).name}): exiting at once, "
                      "cancelling the calls still running", 128 + signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        scheme = "grpc+tls" if tls_cert is not None else "grpc"
        out = out if out is not None else sys.stdout
        out.write(f"{scheme}://{host}:{running.port}\n")
        out.flush()
        # Short waits: a signal that lands on one of gRPC's threads is only handled when the
        # main thread wakes up.
        while not received:
            time.sleep(0.2)
        sys.stderr.write(f"arrowlake serve: shutting down; running calls have "
                         f"{shutdown_timeout:g} s to finish (a second signal exits at once)\n")
        sys.stderr.flush()
    finally:
        closing = threading.Thread(target=running.shutdown, name="flight-shutdown",
                                   daemon=True)  # refuses new calls, waits for running ones
        closing.start()
        deadline = time.monotonic() + shutdown_timeout
        while True:
            closing.join(min(0.2, max(0.01, deadline - time.monotonic())))
            if not closing.is_alive() or time.monotonic() >= deadline:
                break
        if closing.is_alive():
            _exit_now(f"calls still running {shutdown_timeout:g} s after the signal "
                      "(--shutdown-timeout): exiting, which cancels them", 1)
        running.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_now(why: str, status: int) -> None:
    """Leave the process at once: the only way to end calls that do not finish."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is sys.stderr:
                stream.write(f"arrowlake serve: {why}\n")
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
