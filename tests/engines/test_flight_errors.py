"""What arrowlake's errors look like to a Flight client: status code, class, message.

A Python client sees the code as the exception type pyarrow raises for it (below); the Java
example (test_flight_java.py) checks the gRPC codes themselves.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import arrowlake as al
import arrowlake.errors as errors
from arrowlake import flight as alf
from tests.engines.conftest import EVENTS_SCHEMA, events_data, fill_append_table
from tests.engines.test_flight import assert_no_server_traceback

#: The exception a pyarrow client raises for each gRPC status code arrowlake sends.
CLIENT_ERRORS: dict[str, type[Exception]] = {
    "NOT_FOUND": pa.ArrowKeyError,
    "INVALID_ARGUMENT": pa.ArrowInvalid,
    "UNIMPLEMENTED": pa.ArrowNotImplementedError,
    "UNKNOWN": fl.FlightServerError,
    "INTERNAL": fl.FlightInternalError,
    "UNAVAILABLE": fl.FlightUnavailableError,
    "PERMISSION_DENIED": fl.FlightUnauthorizedError,
}
#: Codes sent as a Python exception, whose message pyarrow extends with a (trimmed) detail.
WITH_DETAIL = {"NOT_FOUND", "INVALID_ARGUMENT", "UNIMPLEMENTED"}

ERROR_CLASSES = {cls.__name__: cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(cls, errors.ArrowlakeError)}


def test_every_error_class_has_a_status_flight_can_send():
    assert len(ERROR_CLASSES) >= 20
    for cls in ERROR_CLASSES.values():
        assert cls.grpc_status in CLIENT_ERRORS, cls
    expected = {  # the README's table
        "TableNotFound": "NOT_FOUND", "NamespaceNotFound": "NOT_FOUND",
        "SnapshotNotFound": "NOT_FOUND", "TagNotFound": "NOT_FOUND",
        "ValidationError": "INVALID_ARGUMENT", "SchemaMismatch": "INVALID_ARGUMENT",
        "ColumnNotFound": "INVALID_ARGUMENT", "FilterSyntaxError": "INVALID_ARGUMENT",
        "InvalidName": "INVALID_ARGUMENT", "CommitConflict": "UNAVAILABLE",
        "ConsumerInUse": "UNAVAILABLE", "StorageError": "UNAVAILABLE",
        "ReadOnlyLake": "PERMISSION_DENIED", "DataFileError": "INTERNAL",
        "MetastoreError": "INTERNAL", "MissingDependency": "UNIMPLEMENTED",
        "AlreadyExists": "UNKNOWN", "TableAlreadyExists": "UNKNOWN", "ModeSwitched": "UNKNOWN",
        "ArrowlakeError": "UNKNOWN",
    }
    assert {name: ERROR_CLASSES[name].grpc_status for name in expected} == expected


class FailingLake:
    """Stands in for a lake: looking a table up raises the error class the name names."""

    def table(self, name: str) -> al.Table:
        raise ERROR_CLASSES[name](f"the lake failed on {name}")

    def tables(self) -> list[str]:
        raise errors.MetastoreError("the lake failed to list its tables")


@pytest.fixture(scope="module")
def failing() -> Iterator[fl.FlightClient]:
    server = alf.server(FailingLake(), port=0)  # type: ignore[arg-type]
    client = fl.connect(f"grpc://127.0.0.1:{server.port}")
    yield client
    client.close()
    server.shutdown()


def _check(info: pytest.ExceptionInfo, name: str, code: str, callback: str) -> None:
    message = str(info.value)
    assert assert_no_server_traceback(message, callback) == \
        f"{name}: the lake failed on {name}", message
    if code in WITH_DETAIL:
        assert ". Detail: " in message
    else:  # a Flight error class: a clean message and the class in extra_info
        assert info.value.extra_info == name.encode()


@pytest.mark.parametrize("name", sorted(ERROR_CLASSES))
def test_each_error_class_reaches_a_client_with_its_status(failing, name):
    code = ERROR_CLASSES[name].grpc_status
    command = fl.FlightDescriptor.for_command(json.dumps({"table": name}).encode())
    with pytest.raises(CLIENT_ERRORS[code]) as info:
        failing.get_flight_info(command)
    _check(info, name, code, "_get_flight_info")
    with pytest.raises(CLIENT_ERRORS[code]) as info:
        failing.do_get(fl.Ticket(json.dumps({"table": name, "files": []}).encode())).read_all()
    _check(info, name, code, "_do_get")
    with pytest.raises(CLIENT_ERRORS[code]) as info:
        writer, _ = failing.do_put(command, EVENTS_SCHEMA)
        writer.write_table(events_data(0, 3))
        writer.close()
    _check(info, name, code, "_do_put")


@pytest.mark.parametrize("name", sorted(ERROR_CLASSES))
def test_get_schema_sends_the_codes_it_can_and_no_server_traceback(failing, name):
    """pyarrow's get_schema callback sends every error as a Python exception: NOT_FOUND,
    INVALID_ARGUMENT and UNIMPLEMENTED keep their code, the others arrive as UNKNOWN (a plain
    ArrowException); the appended detail is pyarrow's frame only (issue 31, item 10)."""
    code = ERROR_CLASSES[name].grpc_status
    command = fl.FlightDescriptor.for_command(json.dumps({"table": name}).encode())
    expected = CLIENT_ERRORS[code] if code in WITH_DETAIL else pa.ArrowException
    with pytest.raises(expected) as info:
        failing.get_schema(command)
    message = str(info.value).removeprefix("Unknown error: ")
    assert assert_no_server_traceback(message, "_get_schema") == \
        f"{name}: the lake failed on {name}", message
    assert not isinstance(info.value, fl.FlightError)


def test_listing_fails_without_a_traceback(failing):
    with pytest.raises(fl.FlightInternalError, match="^MetastoreError: the lake failed") as info:
        list(failing.list_flights())
    assert info.value.extra_info == b"MetastoreError"
    assert_no_server_traceback(str(info.value))


def test_actions_answer_without_a_traceback(failing):
    assert list(failing.list_actions()) == []
    with pytest.raises(pa.ArrowNotImplementedError, match="has no actions") as info:
        list(failing.do_action(fl.Action("compact", b"")))
    assert_no_server_traceback(str(info.value), "_do_action")


@pytest.fixture(scope="module")
def lake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[al.Lake, str]]:
    lake = al.connect(tmp_path_factory.mktemp("errors") / "lake")
    fill_append_table(lake, commits=3)
    server = alf.server(lake, port=0)
    yield lake, f"grpc://127.0.0.1:{server.port}"
    server.shutdown()
    lake.close()


@pytest.mark.parametrize(("body", "kind", "name"), [
    ({"table": "shop.missing"}, pa.ArrowKeyError, "TableNotFound"),
    ({"table": "nowhere.events"}, pa.ArrowKeyError, "TableNotFound"),
    ({"table": "shop.events", "snapshot": 999}, pa.ArrowKeyError, "SnapshotNotFound"),
    ({"table": "shop.events", "filter": "nope > 1"}, pa.ArrowInvalid, "ColumnNotFound"),
    ({"table": "shop.events", "filter": "x >"}, pa.ArrowInvalid, "FilterSyntaxError"),
    ({"table": "shop.events", "columns": "id"}, pa.ArrowInvalid, "ValidationError"),
    ({"table": "a.b.c"}, pa.ArrowInvalid, "InvalidName"),
])
def test_a_real_lake_answers_bad_requests_with_their_codes(lake_server, body, kind, name):
    _, location = lake_server
    client = fl.connect(location)
    descriptor = fl.FlightDescriptor.for_command(json.dumps(body).encode())
    for call, callback in ((client.get_flight_info, "_get_flight_info"),
                           (client.get_schema, "_get_schema")):
        with pytest.raises(kind, match=f"^{name}: ") as info:
            call(descriptor)
        assert_no_server_traceback(str(info.value), callback)


def test_a_put_of_the_wrong_schema_is_invalid_argument(lake_server):
    _, location = lake_server
    client = fl.connect(location)
    data = pa.table({"id": ["not a number"]})
    with pytest.raises(pa.ArrowInvalid, match="^SchemaMismatch: .*'id'") as info:
        writer, reader = client.do_put(fl.FlightDescriptor.for_path("shop.events"),
                                       data.schema)
        writer.write_table(data)
        writer.done_writing()
        reader.read()
        writer.close()
    assert_no_server_traceback(str(info.value), "_do_put")


def test_a_missing_data_file_fails_the_stream_as_internal(tmp_path):
    lake = al.connect(tmp_path / "lake")
    table = lake.create_table("s.t", pa.schema([("id", pa.int64())]))
    table.append({"id": [1, 2, 3]})
    server = alf.server(lake, port=0)
    try:
        client = fl.connect(f"grpc://127.0.0.1:{server.port}")
        info = client.get_flight_info(fl.FlightDescriptor.for_path("s.t"))
        for path in Path(table.location).rglob("*.parquet"):
            os.remove(path)
        with pytest.raises(fl.FlightInternalError, match="^DataFileError: ") as raised:
            client.do_get(info.endpoints[0].ticket).read_all()
        assert raised.value.extra_info == b"DataFileError"
        assert_no_server_traceback(str(raised.value))
    finally:
        server.shutdown()
        lake.close()
