"""What the Iceberg REST catalog answers, without HTTP: namespaces, tables, loads and errors.

The web layer (``app.py``) turns requests into calls here and :class:`RestError` into Iceberg's
error model (``{"error": {"message", "type", "code"}}``). Nothing here writes to the lake except
publishing Iceberg metadata, which :func:`arrowlake.iceberg.publish` does on demand.

arrowlake namespaces have one level, so a multipart Iceberg namespace (``a%1Fb``) never exists.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from arrowlake.errors import (
    ArrowlakeError,
    NamespaceNotFound,
    NoIcebergView,
    ReadOnlyLake,
    TableNotFound,
)
from arrowlake.iceberg import Publication, publish, published
from arrowlake.lake import Lake
from arrowlake.table.table import Table

#: The separator of a multipart namespace in paths and ``parent`` (the spec's default, %1F).
NAMESPACE_SEPARATOR = "\x1f"
#: The catalog's name: the path prefix and ``warehouse`` value clients may send.
DEFAULT_NAME = "arrowlake"

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,127}")
_TRUE = {"1", "true", "yes", "on"}

#: How to write, told whenever a client tries to.
HOW_TO_WRITE = (
    "arrowlake's Iceberg REST catalog is read-only: every table is a published view of "
    "arrowlake's metastore, which stays the source of truth. Write with arrowlake's API "
    "(table.append / upsert / delete / merge, lake.create_table), its Spark data source "
    "(df.write.format('arrowlake')), 'arrowlake import' or an Arrow Flight put "
    "('arrowlake serve'); the next load of the table here shows the new snapshot")


class RestError(Exception):
    """An answer in Iceberg's error model: HTTP ``code``, Iceberg exception ``type``."""

    def __init__(self, code: int, type: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.type = type
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


def bad_request(message: str) -> RestError:
    return RestError(400, "BadRequestException", message)


def refused_write(what: str) -> RestError:
    """The answer to every write (create, commit, drop, rename, register, namespaces).

    403 Forbidden, because Iceberg's Java client treats a ForbiddenException as a failure that
    is safe to clean up after: Spark deletes the data files it wrote for the refused commit
    (after a 406 it keeps them, as if the commit's outcome were unknown)."""
    return RestError(403, "ForbiddenException", f"Cannot {what}: {HOW_TO_WRITE}")


# -- settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogSettings:
    """How the catalog presents the lake.

    ``name`` is the path prefix (``/v1/<name>/namespaces``) and the ``warehouse`` value clients
    may send (DuckDB's ``ATTACH '<name>'``); the lake's warehouse location is accepted too.
    ``table_config`` goes into every load's ``config`` (object store endpoint, region, path
    style and, only when the operator asked, credentials).
    """

    name: str = DEFAULT_NAME
    table_config: Mapping[str, str] = field(default_factory=dict)


def _option(options: Mapping[str, Any], *keys: str) -> Any:
    """A storage option by any of its spellings (``endpoint``, ``aws_endpoint``, upper case)."""
    for key, value in options.items():
        bare = key.lower()
        bare = bare[4:] if bare.startswith("aws_") else bare
        if bare in keys and value is not None:
            return value
    return None


def s3_table_config(storage_options: Mapping[str, Any], *, credentials: bool = False,
                    environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The table ``config`` an Iceberg client needs to read files of an S3 lake.

    Endpoint, region and addressing style come from the lake's storage options, else from the
    ``AWS_*`` variables the server runs with. Credentials are included only with
    ``credentials=True`` (``--vend-s3-credentials``): anyone holding a catalog token then reads
    them.
    """
    env = os.environ if environ is None else environ
    config: dict[str, str] = {}
    endpoint = _option(storage_options, "endpoint", "endpoint_url") or env.get(
        "AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        config["s3.endpoint"] = str(endpoint)
    region = _option(storage_options, "region", "default_region") or env.get(
        "AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        config["s3.region"] = config["client.region"] = str(region)
    virtual = _option(storage_options, "virtual_hosted_style_request")
    if virtual is None:
        virtual = env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
    # obstore (and so arrowlake) addresses buckets by path unless told otherwise.
    config["s3.path-style-access"] = "false" if str(virtual).lower() in _TRUE else "true"
    if credentials:
        for keys, theirs, var in (
                (("access_key_id", "access_key"), "s3.access-key-id", "AWS_ACCESS_KEY_ID"),
                (("secret_access_key", "secret_key"), "s3.secret-access-key",
                 "AWS_SECRET_ACCESS_KEY"),
                (("session_token", "token"), "s3.session-token", "AWS_SESSION_TOKEN")):
            value = _option(storage_options, *keys) or env.get(var)
            if value:
                config[theirs] = str(value)
    return config


# -- names ---------------------------------------------------------------------------------------


def namespace_levels(text: str) -> list[str]:
    """A namespace from a path or ``parent`` parameter, split into its levels."""
    if text == "":
        raise bad_request("The namespace is empty: name one, such as 'crm'")
    return text.split(NAMESPACE_SEPARATOR)


def _check_name(what: str, name: str) -> None:
    if not _NAME.fullmatch(name):
        raise bad_request(
            f"Invalid {what} name {name!r}: arrowlake {what}s are letters, digits, '_' or '-' "
            "(at most 128, not starting with '-')")


def namespace_of(lake: Lake, text: str) -> str:
    """The arrowlake namespace a path names; 404 when there is none."""
    levels = namespace_levels(text)
    for level in levels:
        _check_name("namespace", level)
    if len(levels) > 1:
        shown = ".".join(levels)
        raise RestError(404, "NoSuchNamespaceException",
                        f"Namespace does not exist: {shown} (arrowlake namespaces have one "
                        "level; nothing is nested)")
    name = levels[0]
    if name not in lake.namespaces():
        raise RestError(404, "NoSuchNamespaceException", f"Namespace does not exist: {name}")
    return name


def table_of(lake: Lake, namespace_text: str, name: str) -> Table:
    namespace = namespace_of(lake, namespace_text)
    _check_name("table", name)
    try:
        return lake.table(f"{namespace}.{name}")
    except TableNotFound:
        raise RestError(404, "NoSuchTableException",
                        f"Table does not exist: {namespace}.{name}") from None
    except NamespaceNotFound:
        raise RestError(404, "NoSuchNamespaceException",
                        f"Namespace does not exist: {namespace}") from None


def check_warehouse(settings: CatalogSettings, lake: Lake, warehouse: str | None) -> None:
    """A ``warehouse`` a client asks for must be this catalog (its name or the lake's
    warehouse location)."""
    if warehouse in (None, "", settings.name, lake.warehouse, lake.warehouse.rstrip("/")):
        return
    raise RestError(404, "NoSuchWarehouseException",
                    f"Warehouse does not exist: {warehouse!r}; this catalog serves one lake, "
                    f"named {settings.name!r} (or give its warehouse location "
                    f"{lake.warehouse!r}, or no warehouse at all)")


def check_prefix(settings: CatalogSettings, prefix: str | None) -> None:
    if prefix is not None and prefix != settings.name:
        raise RestError(404, "NoSuchWarehouseException",
                        f"Unknown catalog prefix {prefix!r}: this catalog's is "
                        f"{settings.name!r} (or none: /v1/namespaces)")


# -- answers -------------------------------------------------------------------------------------


#: The endpoints ``GET /v1/config`` lists. Writes are listed too: they exist, and refuse with a
#: message saying how to write (clients that checked the list would refuse with none).
ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "POST /v1/{prefix}/namespaces/{namespace}/properties",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/register",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
    "POST /v1/{prefix}/tables/rename",
    "POST /v1/{prefix}/transactions/commit",
]


def config(settings: CatalogSettings, lake: Lake, warehouse: str | None) -> dict[str, Any]:
    check_warehouse(settings, lake, warehouse)
    return {"defaults": {}, "overrides": {}, "endpoints": ENDPOINTS}


def _page(items: Sequence[Any], page_token: str | None, page_size: str | None
          ) -> tuple[list[Any], str | None]:
    """One page of ``items``: tokens are offsets into the sorted list."""
    start = 0
    if page_token not in (None, ""):
        if not page_token.isdigit():
            raise bad_request(f"Invalid pageToken {page_token!r}: pass the next-page-token of "
                              "the previous answer")
        start = int(page_token)
    if page_size in (None, ""):
        return list(items[start:]), None
    if not page_size.isdigit() or int(page_size) < 1:
        raise bad_request(f"Invalid pageSize {page_size!r}: a whole number of at least 1")
    end = start + int(page_size)
    return list(items[start:end]), (str(end) if end < len(items) else None)


def list_namespaces(lake: Lake, parent: str | None, page_token: str | None = None,
                    page_size: str | None = None) -> dict[str, Any]:
    if parent not in (None, ""):
        namespace_of(lake, parent)  # 404 when missing
        names: list[str] = []  # one level: nothing below a namespace
    else:
        names = sorted(lake.namespaces())
    page, token = _page(names, page_token, page_size)
    out: dict[str, Any] = {"namespaces": [[n] for n in page]}
    if token is not None:
        out["next-page-token"] = token
    return out


def load_namespace(lake: Lake, namespace: str) -> dict[str, Any]:
    name = namespace_of(lake, namespace)
    return {"namespace": [name], "properties": {}}


def list_tables(lake: Lake, namespace: str, page_token: str | None = None,
                page_size: str | None = None) -> dict[str, Any]:
    name = namespace_of(lake, namespace)
    tables = sorted(t.split(".", 1)[1] for t in lake.tables(name))
    page, token = _page(tables, page_token, page_size)
    out: dict[str, Any] = {"identifiers": [{"namespace": [name], "name": t} for t in page]}
    if token is not None:
        out["next-page-token"] = token
    return out


def publication(table: Table) -> Publication:
    """The table's current Iceberg metadata: published now if needed, or, on a read-only lake,
    what was published before."""
    try:
        return publish(table)
    except NoIcebergView as exc:
        raise RestError(406, "UnsupportedOperationException", str(exc)) from None
    except ReadOnlyLake:
        pass
    try:
        found = published(table)
    except NoIcebergView as exc:
        raise RestError(406, "UnsupportedOperationException", str(exc)) from None
    if found is None:
        raise RestError(
            406, "UnsupportedOperationException",
            f"Table {table.name} has no Iceberg metadata yet, and this lake is read-only here, "
            "so none can be published now: publish it from a process that may write the lake "
            f"('arrowlake iceberg {table.name}', or 'arrowlake maintain' for tables that opt "
            "in), then load it again")
    return found


@dataclass(frozen=True)
class LoadedTable:
    """A load's answer: the body (None for 304 Not Modified) and its ETag."""

    body: dict[str, Any] | None
    etag: str


def etag_of(metadata_location: str, snapshots: str) -> str:
    """Distinct for every metadata version and for each ``snapshots`` mode, as the spec asks."""
    digest = hashlib.sha256(f"{metadata_location}\n{snapshots}".encode()).hexdigest()
    return f'"{digest[:40]}"'


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    for candidate in if_none_match.split(","):
        candidate = candidate.strip()
        if candidate.startswith("W/"):
            candidate = candidate[2:]
        if candidate in ("*", etag):
            return True
    return False


def referenced_snapshots(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata with only the snapshots that a branch or tag points at (``snapshots=refs``)."""
    refs = metadata.get("refs") or {}
    wanted = {ref.get("snapshot-id") for ref in refs.values()}
    current = metadata.get("current-snapshot-id")
    if current is not None and current != -1:
        wanted.add(current)
    out = dict(metadata)
    out["snapshots"] = [s for s in metadata.get("snapshots") or []
                        if s.get("snapshot-id") in wanted]
    return out


def load_table(settings: CatalogSettings, lake: Lake, namespace: str, name: str,
               snapshots: str | None, if_none_match: str | None) -> LoadedTable:
    mode = "all" if snapshots in (None, "") else snapshots
    if mode not in ("all", "refs"):
        raise bad_request(f"Invalid snapshots={snapshots!r}: use 'all' or 'refs'")
    table = table_of(lake, namespace, name)
    found = publication(table)
    etag = etag_of(found.metadata_location, mode)
    if etag_matches(if_none_match, etag):
        return LoadedTable(None, etag)
    metadata = found.metadata if mode == "all" else referenced_snapshots(found.metadata)
    return LoadedTable({"metadata-location": found.metadata_location, "metadata": metadata,
                        "config": dict(settings.table_config)}, etag)


def internal_error(exc: BaseException) -> RestError:
    """A failure the client cannot fix: arrowlake's message where there is one."""
    if isinstance(exc, ArrowlakeError):
        return RestError(500, type(exc).__name__, str(exc))
    return RestError(500, "InternalServerError",
                     f"Internal error ({type(exc).__name__}); the server's log has the details")
