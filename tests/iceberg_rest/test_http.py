"""The Iceberg REST protocol as a client sees it on the wire: endpoints, ETags, errors, auth.

Requests go to a real server (uvicorn on a free port) over the lake of ``conftest.py``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
import requests

import arrowlake as al
from arrowlake.errors import NoIcebergView, StorageError
from arrowlake.iceberg import publish, published
from arrowlake.iceberg_rest import RunningCatalog, s3_table_config
from arrowlake.iceberg_rest import catalog as catalog_module
from arrowlake.iceberg_rest.catalog import CatalogSettings
from arrowlake.lake import Lake
from arrowlake.metastore import Metastore
from tests.iceberg_rest.conftest import TOKEN, LakeFixture

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def get(url: str, path: str, **kwargs: object) -> requests.Response:
    headers = {**AUTH, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return requests.get(url + path, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]


def assert_error(response: requests.Response, code: int, type: str, *words: str) -> str:
    """Iceberg's error model: ``{"error": {"message", "type", "code"}}`` and nothing else."""
    assert response.status_code == code, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["type"] == type
    message = body["error"]["message"]
    for word in words:
        assert word in message, message
    return message


# -- config and namespaces -----------------------------------------------------------------------


def test_config_lists_the_endpoints_and_accepts_this_catalogs_warehouse(catalog_url, lake_fx):
    body = get(catalog_url, "/v1/config").json()
    assert body["defaults"] == {} and body["overrides"] == {}
    assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}" in body["endpoints"]
    assert "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}" in body["endpoints"]
    for warehouse in ("arrowlake", str(lake_fx.path)):
        assert get(catalog_url, "/v1/config", params={"warehouse": warehouse}).status_code == 200
    assert_error(get(catalog_url, "/v1/config", params={"warehouse": "elsewhere"}), 404,
                 "NoSuchWarehouseException", "'elsewhere'", "arrowlake")


def test_namespaces_list_load_and_exist(catalog_url):
    assert get(catalog_url, "/v1/namespaces").json() == {
        "namespaces": [["crm"], ["empty_ns"], ["shop"]]}
    # One level: nothing below a namespace; a missing parent is 404.
    assert get(catalog_url, "/v1/namespaces", params={"parent": "crm"}).json() == {
        "namespaces": []}
    assert_error(get(catalog_url, "/v1/namespaces", params={"parent": "nope"}), 404,
                 "NoSuchNamespaceException", "nope")
    assert get(catalog_url, "/v1/namespaces/crm").json() == {"namespace": ["crm"],
                                                             "properties": {}}
    assert requests.head(catalog_url + "/v1/namespaces/crm", headers=AUTH).status_code == 204
    assert requests.head(catalog_url + "/v1/namespaces/nope", headers=AUTH).status_code == 404
    assert_error(get(catalog_url, "/v1/namespaces/nope"), 404, "NoSuchNamespaceException")
    # A multipart namespace (levels joined by %1F) cannot exist here.
    assert_error(get(catalog_url, "/v1/namespaces/crm%1Fsub/tables"), 404,
                 "NoSuchNamespaceException", "crm.sub", "one level")


def test_pages_of_namespaces_and_tables(catalog_url):
    first = get(catalog_url, "/v1/namespaces", params={"pageSize": 2}).json()
    assert first["namespaces"] == [["crm"], ["empty_ns"]]
    rest = get(catalog_url, "/v1/namespaces",
               params={"pageSize": 2, "pageToken": first["next-page-token"]}).json()
    assert rest == {"namespaces": [["shop"]]}
    tables = get(catalog_url, "/v1/namespaces/crm/tables").json()
    assert tables == {"identifiers": [{"namespace": ["crm"], "name": n}
                                      for n in ("evolving", "legacy", "users")]}
    assert get(catalog_url, "/v1/namespaces/empty_ns/tables").json() == {"identifiers": []}
    assert_error(get(catalog_url, "/v1/namespaces/crm/tables", params={"pageSize": "0"}), 400,
                 "BadRequestException", "pageSize")
    assert_error(get(catalog_url, "/v1/namespaces/nope/tables"), 404,
                 "NoSuchNamespaceException")


def test_the_catalog_prefix_is_optional(catalog_url):
    assert get(catalog_url, "/v1/arrowlake/namespaces/shop/tables").json() == {
        "identifiers": [{"namespace": ["shop"], "name": "events"}]}
    assert_error(get(catalog_url, "/v1/other/namespaces"), 404, "NoSuchWarehouseException",
                 "'other'")


# -- loading tables ------------------------------------------------------------------------------


def test_load_returns_the_published_metadata_and_its_location(catalog_url, lake_fx):
    response = get(catalog_url, "/v1/namespaces/crm/tables/users")
    assert response.status_code == 200
    body = response.json()
    table = lake_fx.lake.table("crm.users")
    current = published(table)
    assert current is not None
    assert body["metadata-location"] == current.metadata_location
    assert body["metadata"] == current.metadata
    assert body["metadata"]["format-version"] == 3
    assert body["metadata"]["current-snapshot-id"] == table.current_snapshot_id
    assert body["config"] == {}
    assert requests.head(catalog_url + "/v1/namespaces/crm/tables/users",
                         headers=AUTH).status_code == 204
    assert requests.head(catalog_url + "/v1/namespaces/crm/tables/nope",
                         headers=AUTH).status_code == 404
    assert_error(get(catalog_url, "/v1/namespaces/crm/tables/nope"), 404,
                 "NoSuchTableException", "crm.nope")
    assert_error(get(catalog_url, "/v1/namespaces/nope/tables/users"), 404,
                 "NoSuchNamespaceException")


def test_snapshots_refs_keeps_only_referenced_snapshots(catalog_url, lake_fx):
    every = get(catalog_url, "/v1/namespaces/crm/tables/users", params={"snapshots": "all"})
    refs = get(catalog_url, "/v1/namespaces/crm/tables/users", params={"snapshots": "refs"})
    all_ids = {s["snapshot-id"] for s in every.json()["metadata"]["snapshots"]}
    ref_ids = {s["snapshot-id"] for s in refs.json()["metadata"]["snapshots"]}
    table = lake_fx.lake.table("crm.users")
    assert all_ids == set(table.snapshots().column("snapshot_id").to_pylist())
    assert ref_ids == {table.current_snapshot_id, table.tags()["v2"]}
    assert len(all_ids) > len(ref_ids)
    # The same version in two representations: two ETags (the spec asks for it).
    assert every.headers["etag"] != refs.headers["etag"]
    assert_error(get(catalog_url, "/v1/namespaces/crm/tables/users",
                     params={"snapshots": "some"}), 400, "BadRequestException", "'some'")


def test_if_none_match_answers_304_until_the_table_changes(tmp_path):
    lake = al.connect(tmp_path / "lake")
    table = lake.create_table("t", pa.schema([("id", pa.int64())]))
    table.append({"id": [1, 2]})
    with RunningCatalog(lake, port=0, shutdown_timeout=5) as running:
        url = running.url + "/v1/namespaces/default/tables/t"
        first = requests.get(url, timeout=60)
        etag = first.headers["etag"]
        assert first.status_code == 200 and etag.startswith('"')
        again = requests.get(url, headers={"If-None-Match": etag}, timeout=60)
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] == etag
        table.append({"id": [3]})
        changed = requests.get(url, headers={"If-None-Match": etag}, timeout=60)
        assert changed.status_code == 200
        assert changed.headers["etag"] != etag
        assert changed.json()["metadata"]["current-snapshot-id"] == table.current_snapshot_id
        assert changed.json()["metadata-location"] != first.json()["metadata-location"]
    lake.close()


def test_a_merge_on_read_table_answers_why_it_has_no_iceberg_view(catalog_url, lake_fx):
    with pytest.raises(NoIcebergView) as raised:
        publish(lake_fx.lake.table("crm.legacy"))
    message = assert_error(get(catalog_url, "/v1/namespaces/crm/tables/legacy"), 406,
                           "UnsupportedOperationException")
    assert message == str(raised.value)
    # It exists, and is listed: only its Iceberg view is missing.
    assert requests.head(catalog_url + "/v1/namespaces/crm/tables/legacy",
                         headers=AUTH).status_code == 204


def test_a_read_only_lake_serves_what_was_published(tmp_path):
    folder = tmp_path / "lake"
    lake = al.connect(folder)
    done = lake.create_table("done", pa.schema([("id", pa.int64())]))
    done.append({"id": [1]})
    location = publish(done).metadata_location
    lake.create_table("never", pa.schema([("id", pa.int64())])).append({"id": [1]})
    lake.close()
    read_only = Lake(Metastore(f"sqlite:///file:{folder / 'arrowlake.db'}?mode=ro&uri=true"),
                     str(folder))
    with RunningCatalog(read_only, port=0, shutdown_timeout=5) as running:
        ok = requests.get(running.url + "/v1/namespaces/default/tables/done", timeout=60)
        assert ok.status_code == 200 and ok.json()["metadata-location"] == location
        missing = requests.get(running.url + "/v1/namespaces/default/tables/never", timeout=60)
        assert_error(missing, 406, "UnsupportedOperationException", "read-only",
                     "arrowlake iceberg default.never")
    read_only.close()


# -- writes are refused, whole -------------------------------------------------------------------


WRITES = [
    ("post", "/v1/namespaces", {"namespace": ["new"]}, "create a namespace"),
    ("delete", "/v1/namespaces/empty_ns", None, "drop a namespace"),
    ("post", "/v1/namespaces/crm/properties", {"updates": {"a": "b"}},
     "change a namespace's properties"),
    ("post", "/v1/namespaces/crm/tables", {"name": "t2", "schema": {"type": "struct",
                                                                     "fields": []}},
     "create a table"),
    ("post", "/v1/namespaces/crm/tables/users",
     {"requirements": [], "updates": [{"action": "set-properties", "updates": {"a": "b"}}]},
     "commit to a table"),
    ("delete", "/v1/namespaces/crm/tables/users", None, "drop a table"),
    ("post", "/v1/namespaces/crm/register", {"name": "r", "metadata-location": "/x"},
     "register a table"),
    ("post", "/v1/tables/rename", {"source": {"namespace": ["crm"], "name": "users"},
                                   "destination": {"namespace": ["crm"], "name": "u2"}},
     "rename a table"),
    ("post", "/v1/transactions/commit", {"table-changes": []}, "commit a transaction"),
]


@pytest.mark.parametrize(("method", "path", "body", "what"), WRITES,
                         ids=[w[3] for w in WRITES])
def test_every_write_is_refused_with_how_to_write(catalog_url, lake_fx: LakeFixture,
                                                 method, path, body, what):
    lake = lake_fx.lake
    before = ({ns: lake.tables(ns) for ns in lake.namespaces()},
              lake.table("crm.users").snapshots().num_rows, lake.table("crm.users").properties)
    response = getattr(requests, method)(catalog_url + path, json=body, headers=AUTH,
                                         timeout=60)
    assert_error(response, 403, "ForbiddenException", f"Cannot {what}",
                 "read-only", "table.append", "format('arrowlake')")
    after = ({ns: lake.tables(ns) for ns in lake.namespaces()},
             lake.table("crm.users").snapshots().num_rows, lake.table("crm.users").properties)
    assert after == before


def test_malformed_requests_get_the_error_model(catalog_url):
    assert_error(get(catalog_url, "/v1/nothing/here/at/all"), 404, "NotFoundException",
                 "No such endpoint")
    assert_error(requests.put(catalog_url + "/v1/namespaces/crm", headers=AUTH, timeout=60),
                 405, "UnsupportedOperationException", "PUT")
    assert_error(get(catalog_url, "/v1/namespaces/bad%20name/tables"), 400,
                 "BadRequestException", "'bad name'")
    assert_error(get(catalog_url, "/v1/namespaces/crm/tables/bad.name"), 400,
                 "BadRequestException", "'bad.name'")
    assert_error(get(catalog_url, "/v1/namespaces/%1F/tables"), 400, "BadRequestException")


# -- auth ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer ", f"Basic {TOKEN}",
                                    f"Bearer {TOKEN}x"])
def test_requests_without_a_valid_token_get_401(catalog_url, header):
    headers = {} if header is None else {"Authorization": header}
    for path in ("/v1/config", "/v1/namespaces/crm/tables/users", "/v1/nothing"):
        response = requests.get(catalog_url + path, headers=headers, timeout=60)
        assert_error(response, 401, "NotAuthorizedException", "token=")
        assert response.headers["www-authenticate"] == "Bearer"


def test_the_oauth_endpoint_issues_no_tokens(catalog_url):
    response = requests.post(catalog_url + "/v1/oauth/tokens", timeout=60,
                             data={"grant_type": "client_credentials", "client_id": "a",
                                   "client_secret": "b"})
    assert response.status_code == 400
    assert response.json()["error"] == "unsupported_grant_type"
    assert "token=" in response.json()["error_description"]


# -- configuration for object stores -------------------------------------------------------------


def test_s3_table_config_sends_credentials_only_when_asked():
    options = {"endpoint": "http://127.0.0.1:9000", "region": "eu-west-1",
               "access_key_id": "AK", "secret_access_key": "SK",
               "client_options": {"allow_http": True}}
    plain = s3_table_config(options, environ={})
    assert plain == {"s3.endpoint": "http://127.0.0.1:9000", "s3.region": "eu-west-1",
                     "client.region": "eu-west-1", "s3.path-style-access": "true"}
    vended = s3_table_config(options, credentials=True, environ={})
    assert vended == {**plain, "s3.access-key-id": "AK", "s3.secret-access-key": "SK"}
    virtual = s3_table_config({"aws_virtual_hosted_style_request": "true"},
                              environ={"AWS_REGION": "us-east-1"})
    assert virtual == {"s3.region": "us-east-1", "client.region": "us-east-1",
                       "s3.path-style-access": "false"}


def test_table_config_reaches_every_load(tmp_path):
    lake = al.connect(tmp_path / "lake")
    lake.create_table("t", pa.schema([("id", pa.int64())])).append({"id": [1]})
    settings = CatalogSettings(table_config={"s3.endpoint": "http://127.0.0.1:1"})
    with RunningCatalog(lake, port=0, settings=settings, shutdown_timeout=5) as running:
        body = requests.get(running.url + "/v1/namespaces/default/tables/t", timeout=60).json()
    assert body["config"] == {"s3.endpoint": "http://127.0.0.1:1"}
    lake.close()


def test_without_starlette_the_error_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None\n"
            "import arrowlake as al\n"
            "from arrowlake.errors import MissingDependency\n"
            "from arrowlake.iceberg_rest import RunningCatalog\n"
            f"lake = al.connect({str(tmp_path / 'lake')!r})\n"
            "try:\n"
            "    RunningCatalog(lake, port=0)\n"
            "except MissingDependency as exc:\n"
            "    print(exc)\n")
    src = str(Path(al.__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert "pip install 'arrowlake[iceberg-rest]'" in proc.stdout, proc.stderr


def test_server_failures_are_500_in_the_error_model(tmp_path, monkeypatch, capfd):
    lake = al.connect(tmp_path / "lake")
    lake.create_table("t", pa.schema([("id", pa.int64())])).append({"id": [1]})

    def broken(table: object, snapshot_id: object = None) -> None:
        raise RuntimeError("publisher exploded")

    def unreadable(table: object, snapshot_id: object = None) -> None:
        raise StorageError("Cannot read s3://bucket/x: connection reset")

    with RunningCatalog(lake, port=0, shutdown_timeout=5) as running:
        url = running.url + "/v1/namespaces/default/tables/t"
        monkeypatch.setattr(catalog_module, "publish", broken)
        message = assert_error(requests.get(url, timeout=60), 500, "InternalServerError",
                               "RuntimeError", "server's log")
        assert "exploded" not in message  # details stay in the server's log
        assert "publisher exploded" in capfd.readouterr().err
        monkeypatch.setattr(catalog_module, "publish", unreadable)
        assert_error(requests.get(url, timeout=60), 500, "StorageError",
                     "connection reset")
    lake.close()


def test_concurrent_loads_while_commits_land_all_answer_a_published_snapshot(tmp_path):
    lake = al.connect(tmp_path / "lake")
    table = lake.create_table("t", pa.schema([("id", pa.int64())]))
    table.append({"id": [0]})
    answers: list[tuple[int, str, int]] = []
    errors: list[str] = []

    def load(url: str) -> None:
        with requests.Session() as session:
            for _ in range(8):
                response = session.get(url, timeout=60)
                if response.status_code != 200:
                    errors.append(response.text)
                    continue
                body = response.json()
                answers.append((body["metadata"]["current-snapshot-id"],
                                body["metadata-location"],
                                len(body["metadata"]["snapshots"])))

    with RunningCatalog(lake, port=0, shutdown_timeout=5) as running:
        url = running.url + "/v1/namespaces/default/tables/t"
        threads = [threading.Thread(target=load, args=(url,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for i in range(1, 6):
            table.append({"id": [i]})
        for thread in threads:
            thread.join(120)
        final = requests.get(url, timeout=60).json()
    assert errors == []
    assert len(answers) == 32
    # One metadata file per snapshot, whoever published it: every answer for a snapshot names
    # the same file, and lists that snapshot and its ancestors.
    by_snapshot: dict[int, set[str]] = {}
    for snapshot, location, listed in answers:
        by_snapshot.setdefault(snapshot, set()).add(location)
        assert listed == snapshot
    assert all(len(locations) == 1 for locations in by_snapshot.values()), by_snapshot
    assert final["metadata"]["current-snapshot-id"] == table.current_snapshot_id == 6
    lake.close()
