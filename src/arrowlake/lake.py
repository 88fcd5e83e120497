"""A lake: a metastore plus a warehouse location where tables keep their files."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

# Imported for what importing them installs: Table.stream() (arrowlake.streaming.stream) and
# Scan.to_dask()/to_torch() (the adapters register themselves), so every table of a lake has
# its whole API however arrowlake was imported (``import arrowlake`` imports nothing).
from arrowlake import dask as _dask  # noqa: F401
from arrowlake import torch as _torch  # noqa: F401
from arrowlake.errors import (
    InvalidName,
    ReadOnlyLake,
    SchemaMismatch,
    TableNotFound,
    ValidationError,
)
from arrowlake.integrations.pandas import from_pandas
from arrowlake.io.storage import (
    Storage,
    is_within,
    normalize_location,
    split_scheme,
    storage_for,
)
from arrowlake.maintenance import Action, Maintainer
from arrowlake.metastore.inflight import WriteRegistration
from arrowlake.metastore.store import Metastore
from arrowlake.schema import (
    assign_field_ids,
    find_field,
    schema_without_views,
    validate_schema,
)
from arrowlake.streaming import stream as _stream  # noqa: F401
from arrowlake.table.maintenance.housekeeping import metastore_files, own_files
from arrowlake.table.options.maintenance import (
    COMPACTION_MODE,
    DEFAULT_COMPACTION_MODE,
    NEW_TABLE_COMPACTION_MODE,
    warn_unsafe_properties,
)
from arrowlake.table.options.primary_key import validate_pk_options, validate_properties
from arrowlake.table.table import Table
from arrowlake.table.transaction import LakeSnapshot, Transaction

if TYPE_CHECKING:
    import pandas as pd

# Matched with fullmatch: ``$`` would accept a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,127}")
DEFAULT_NAMESPACE = "default"

_PARTITION_TYPES = "integers, strings, dates, timestamps, booleans and decimals"


def parse_table_name(name: str) -> tuple[str, str]:
    """``"ns.table"`` (or ``"table"`` in the default namespace) as ``(namespace, table)``."""
    if not isinstance(name, str):
        raise InvalidName(f"Table names are strings like 'shop.orders', got {name!r}")
    parts = name.split(".")
    if len(parts) == 1:
        parts = [DEFAULT_NAMESPACE, parts[0]]
    if len(parts) != 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise InvalidName(
            f"Invalid table name {name!r}: use 'namespace.table', each part of letters, digits, "
            "'_' or '-' (at most 128, not starting with '-'); '/', '..', quotes and spaces are "
            "not allowed")
    return parts[0], parts[1]


def _check_partition_by(schema: pa.Schema, partition_by: Sequence[str]) -> None:
    for name in partition_by:
        field = find_field(schema, name)
        t = field.type
        ok = (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
              or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_boolean(t)
              or pa.types.is_decimal(t))
        if not ok:
            raise SchemaMismatch(
                f"Cannot partition by '{name}' of type {t}: partition columns may be "
                f"{_PARTITION_TYPES}")
    if len(set(partition_by)) != len(partition_by):
        raise ValidationError(f"partition_by repeats columns: {list(partition_by)}")


class Lake:
    """Namespaces and tables in one metastore. Create with :func:`arrowlake.connect`."""

    def __init__(self, metastore: Metastore, warehouse: str,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.metastore = metastore
        self.warehouse = normalize_location(warehouse)
        self.storage_options = dict(storage_options or {})
        self._storages: dict[str, Storage] = {}

    def __repr__(self) -> str:
        return f"<arrowlake.Lake warehouse={self.warehouse!r} metastore={self.metastore.dialect}>"

    def close(self) -> None:
        self.metastore.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def storage_for(self, location: str) -> Storage:
        scheme, rest = split_scheme(location)
        key = scheme if scheme == "file" else f"{scheme}://{rest.split('/', 1)[0]}"
        storage = self._storages.get(key)
        if storage is None:
            storage = storage_for(location, self.storage_options)
            self._storages[key] = storage
        return storage

    # -- namespaces ----------------------------------------------------------------------------

    def namespaces(self) -> list[str]:
        return self.metastore.namespaces()

    def create_namespace(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidName(
                f"Invalid namespace name {name!r}: use letters, digits, '_' or '-' (at most "
                "128, not starting with '-')")
        self.metastore.create_namespace(name)

    def drop_namespace(self, name: str) -> None:
        self.metastore.drop_namespace(name)

    # -- tables --------------------------------------------------------------------------------

    def tables(self, namespace: str | None = None) -> list[str]:
        """Names (``ns.table``) of the tables, of one namespace or all."""
        return [f"{ns}.{name}" for ns, name in self.metastore.list_tables(namespace)]

    def table(self, name: str) -> Table:
        ns, tbl = parse_table_name(name)
        return Table(self, self.metastore.load_table(ns, tbl))

    def table_exists(self, name: str) -> bool:
        try:
            self.table(name)
        except TableNotFound:
            return False
        return True

    def create_table(
        self,
        name: str,
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] | str | None = (),
        primary_key: Sequence[str] | str | None = (),
        buckets: int | None = None,
        properties: Mapping[str, Any] | None = None,
        location: str | None = None,
        exist_ok: bool = False,
        **options: Any,
    ) -> Table:
        """Create a table. ``properties`` tune writes (``write.target-file-size``, ...)."""
        ns, tbl = parse_table_name(name)
        if exist_ok and self.table_exists(name):
            return self.table(name)
        if not isinstance(schema, pa.Schema):
            raise ValidationError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        validate_schema(schema)
        schema = schema_without_views(schema)
        partition_by = _column_list("partition_by", partition_by)
        primary_key = _column_list("primary_key", primary_key)
        _check_partition_by(schema, partition_by)
        props = {str(k): str(v) for k, v in (properties or {}).items()}
        if primary_key or options:
            schema, buckets, props = validate_pk_options(schema, primary_key, partition_by,
                                                         buckets, props, options)
        if primary_key and NEW_TABLE_COMPACTION_MODE != DEFAULT_COMPACTION_MODE:
            props.setdefault(COMPACTION_MODE, NEW_TABLE_COMPACTION_MODE)
        validate_properties(props, primary_key)
        warn_unsafe_properties(props)
        with_ids, next_id = assign_field_ids(schema)
        if location is None:
            location = self.storage_for(self.warehouse).join(
                self.warehouse, ns, f"{tbl}-{uuid.uuid4().hex[:8]}")
        else:
            location = normalize_location(location)
        self._check_location(f"{ns}.{tbl}", location)
        record = self.metastore.create_table(
            ns, tbl, location=location, schema=with_ids, last_field_id=next_id - 1,
            partition_by=partition_by, primary_key=primary_key, buckets=buckets,
            properties=props)
        return Table(self, record)

    def _check_location(self, name: str, location: str) -> None:
        """Refuse a location that would mix the table's files with others': the warehouse root
        (or above it), another table's location (or one inside or around it), or a folder
        holding the metastore database. Orphan removal and purge delete what such a location
        holds."""
        if is_within(self.warehouse, location):
            where = "is" if location == self.warehouse else "contains"
            raise ValidationError(
                f"Table '{name}' cannot be located at {location!r}: it {where} the warehouse "
                f"root {self.warehouse!r}, where every table keeps its folder. Give the table "
                "a folder of its own, or leave location= out")
        for _, other, other_location in self.metastore.table_locations():
            if is_within(location, other_location) or is_within(other_location, location):
                relation = ("is the location of" if location == other_location else
                            "is inside the location of" if is_within(location, other_location)
                            else "contains the location of")
                raise ValidationError(
                    f"Table '{name}' cannot be located at {location!r}: it {relation} table "
                    f"'{other}' ({other_location!r}), whose files it would share. Give the "
                    "table a folder of its own, or leave location= out")
        for path in metastore_files(self.metastore):
            if is_within(path, location):
                raise ValidationError(
                    f"Table '{name}' cannot be located at {location!r}: it contains the "
                    f"metastore database {path!r}. Give the table a folder of its own, or "
                    "leave location= out")

    def drop_table(self, name: str, purge: bool = False) -> None:
        """Drop a table from the metastore; with ``purge`` also delete its files (never those
        below another table's location, nor the metastore's)."""
        table = self.table(name)
        storage = table._storage
        self.metastore.drop_table(table._record.table_id)
        if purge:
            files = own_files(storage, table.location, self.metastore, None)
            storage.delete([f.path for f in files])

    def rename_table(self, old: str, new: str) -> Table:
        table = self.table(old)
        ns, tbl = parse_table_name(new)
        self.metastore.rename_table(table._record.table_id, ns, tbl)
        return self.table(new)

    def transaction(self, *, commit_id: str | None = None) -> Transaction:
        """Writes to several tables committed in one metastore transaction: all, or none.

        >>> with lake.transaction() as tx:                       # doctest: +SKIP
        ...     tx.table("shop.orders").append(orders)
        ...     tx.table("shop.lines").upsert(lines)
        ...     tx.table("shop.daily").merge(daily, on="day").when_matched_update(
        ...         set={"total": "source.total"}).when_not_matched_insert().execute()

        Leaving the block commits; an exception aborts it and deletes the files written. Reads
        through ``tx.table(name)`` see every table as of the transaction's start. Each
        write's files are known to orphan removal from the moment they are written until the
        transaction ends. ``commit_id`` makes the whole transaction idempotent (writes inside
        take none of their own). See :mod:`arrowlake.table.transaction` and the README,
        "Transactions", for the guarantees and limits.
        """
        if self.metastore.read_only:
            raise ReadOnlyLake(f"Cannot start a transaction: the lake's metastore "
                               f"{self.metastore.location} is read-only here")
        heads = self.metastore.table_heads()
        registration = WriteRegistration(self.metastore, None, "transaction")
        return Transaction(self.table, heads, registration, commit_id=commit_id)

    def snapshot(self) -> LakeSnapshot:
        """Every table as of one moment: ``snap.table(name)`` reads the table at the snapshot
        it was at then (a lake transaction is wholly in the cut or wholly out of it).

        >>> snap = lake.snapshot()                                # doctest: +SKIP
        >>> orders = snap.table("shop.orders").to_arrow()
        >>> lines = snap.table("shop.lines").to_arrow()          # consistent with orders
        """
        return LakeSnapshot(self.table, self.metastore.table_heads(), datetime.now(UTC))

    def maintain(self, tables: Sequence[str] | None = None, once: bool = True, *,
                 max_concurrent: int = 1, bytes_per_second: float | None = None,
                 interval: float = 60.0, orphans_every: float = 3600.0,
                 on_action: Callable[[Action], None] | None = None,
                 stop: threading.Event | None = None) -> list[Action]:
        """Look after the lake's tables (all of them, or those named): compact the due buckets
        of tables in ``compaction.mode`` deferred, expire snapshots by ``snapshot.retain-last``
        and ``snapshot.max-age``, and delete orphan files older than ``orphan.min-age``.

        With ``once`` every table is looked after once and the actions taken are returned (for
        a scheduler or cron). Otherwise the service runs, woken by commits, until ``stop`` is
        set (or KeyboardInterrupt); either way setting ``stop`` lets the actions in progress
        finish and starts no new one. ``on_action`` sees each action as it is taken. At most
        ``max_concurrent`` tables are worked on at once, and compaction reads and writes at
        most ``bytes_per_second`` on average. See :mod:`arrowlake.maintenance.service`.
        """
        if max_concurrent < 1:
            raise ValidationError(f"max_concurrent must be at least 1, not {max_concurrent}")
        if bytes_per_second is not None and not bytes_per_second > 0:
            raise ValidationError(
                f"bytes_per_second must be above 0 (or None: no limit), not {bytes_per_second}")
        for name, seconds in (("interval", interval), ("orphans_every", orphans_every)):
            if not (isinstance(seconds, int | float) and math.isfinite(seconds)
                    and seconds >= 0):
                raise ValidationError(
                    f"{name} must be a number of seconds, 0 or more, not {seconds!r}")
        chosen = None if tables is None else [self.table(name) for name in tables]
        service = Maintainer(self, chosen, max_concurrent=max_concurrent,
                             bytes_per_second=bytes_per_second, interval=interval,
                             orphans_every=orphans_every, on_action=on_action)
        if stop is not None:
            def relay() -> None:
                while not service.stopping:
                    if stop.wait(0.1):
                        service.stop()
            threading.Thread(target=relay, name="arrowlake-maintain-stop", daemon=True).start()
        try:
            return service.run(once=once)
        except KeyboardInterrupt:
            service.stop()
            return list(service.actions)

    def from_pandas(self, name: str, df: pd.DataFrame, schema: Any = None,
                    splits_num: int | None = None, **create_table_options: Any) -> Table:
        """Create a table from a DataFrame in one call, written as ``splits_num`` files.

        ``schema`` is None (inferred), a ``pa.Schema`` (used as is), a list of column names
        (types inferred) or a list of Arrow types (names from the DataFrame). Given types are
        converted to as ``pa.Array.from_pandas(..., type=)`` does (NaN becomes null); a value
        that does not fit raises :class:`~arrowlake.errors.SchemaMismatch` naming the column
        and the value. ``splits_num`` defaults to the number of CPU cores.
        """
        return from_pandas(self, name, df, schema=schema, splits_num=splits_num,
                           **create_table_options)


def connect(uri: str | os.PathLike[str], *, warehouse: str | None = None,
            storage_options: Mapping[str, Any] | None = None,
            commit_retries: int = 100) -> Lake:
    """Open (creating if needed) a lake.

    ``connect("./lake")`` keeps an SQLite metastore at ``./lake/arrowlake.db`` and data files
    under ``./lake``. ``connect("postgresql://user@host/db", warehouse="s3://bucket/lake")`` or
    ``connect("sqlite:///meta.db", warehouse="/data/lake")`` separate the two.

    >>> import arrowlake as al
    >>> lake = al.connect("/tmp/doctest-lake")
    >>> lake.warehouse
    '/tmp/doctest-lake'
    """
    text = os.fspath(uri)
    if "://" in text and not text.startswith("file://"):
        if warehouse is None:
            raise ValidationError(
                f"connect({text!r}) needs warehouse=: the location (path or s3://...) where "
                "tables keep their data files")
        url = text
        wh = warehouse
    else:
        path = normalize_location(text)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
                raise
            raise ReadOnlyLake(
                f"Cannot create the lake folder {path}: {exc.strerror or exc}") from exc
        url = f"sqlite:///{os.path.join(path, 'arrowlake.db')}"
        wh = warehouse or path
    return Lake(Metastore(url, commit_retries=commit_retries), wh, storage_options)


#: The environment variables naming the default lake: where no option, argument or ``--lake``
#: names one (a Spark pipeline, a cluster's executors and a notebook all find the lake there).
LAKE_ENV = "ARROWLAKE_LAKE"
WAREHOUSE_ENV = "ARROWLAKE_WAREHOUSE"
STORAGE_OPTIONS_ENV = "ARROWLAKE_STORAGE_OPTIONS"


@dataclass(frozen=True)
class LakeAddress:
    """Where a lake is: the arguments of :func:`connect`."""

    uri: str
    warehouse: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    def connect(self) -> Lake:
        return connect(self.uri, warehouse=self.warehouse,
                       storage_options=dict(self.storage_options) or None)


def lake_address(uri: str | os.PathLike[str] | None = None, *, warehouse: str | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 environ: Mapping[str, str] | None = None,
                 given_by: str = "a lake argument") -> LakeAddress:
    """The lake named by ``uri``, or else the environment's default lake.

    With ``uri``, the other arguments are used as given. Without it, ``$ARROWLAKE_LAKE`` names
    the lake, ``$ARROWLAKE_WAREHOUSE`` its warehouse (unless ``warehouse`` is given) and
    ``$ARROWLAKE_STORAGE_OPTIONS`` (a JSON object) its storage options, which
    ``storage_options`` extend. ``given_by`` says how a caller names a lake, for the error
    raised when neither names one.
    """
    if uri is not None and os.fspath(uri) != "":
        return LakeAddress(os.fspath(uri), warehouse, dict(storage_options or {}))
    env = os.environ if environ is None else environ
    text = env.get(LAKE_ENV, "").strip()
    if not text:
        raise ValidationError(
            f"No lake given: pass {given_by}, or set ${LAKE_ENV} to the lake (a path, or a "
            f"database URL with ${WAREHOUSE_ENV})")
    storage = _env_storage_options(env)
    storage.update(storage_options or {})
    return LakeAddress(text, warehouse or env.get(WAREHOUSE_ENV, "").strip() or None, storage)


def _env_storage_options(env: Mapping[str, str]) -> dict[str, Any]:
    text = env.get(STORAGE_OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValidationError(
            f"${STORAGE_OPTIONS_ENV} is not valid JSON ({exc}): set it to a JSON object such "
            'as \'{"endpoint": "http://127.0.0.1:9000", "region": "us-east-1"}\'') from None
    if not isinstance(value, dict):
        raise ValidationError(
            f"${STORAGE_OPTIONS_ENV} must be a JSON object of storage options, got "
            f"{type(value).__name__}: {text[:80]!r}")
    return value


def _column_list(what: str, columns: object) -> list[str]:
    """``None``, one column name or a sequence of names, as a list of names."""
    if columns is None:
        return []
    if isinstance(columns, str):
        return [columns]
    if isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
        return list(columns)
    raise ValidationError(
        f"{what} must be a column name or a list of column names, got {columns!r}")
