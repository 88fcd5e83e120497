"""The SQL metastore: namespaces, tables, schemas, snapshots, files and tags as database rows.

One :class:`Metastore` wraps one SQLAlchemy engine. A commit is one database transaction that
checks for conflicts and records a snapshot and its files; see :meth:`Metastore.commit`.
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from arrowlake import schema as schemas_mod
from arrowlake.errors import (
    CommitConflict,
    InvalidName,
    MetastoreError,
    NamespaceNotFound,
    ReadOnlyLake,
    SnapshotNotFound,
    TableAlreadyExists,
    TableNotFound,
    TagNotFound,
    ValidationError,
)
from arrowlake.metastore import signals
from arrowlake.metastore import tables as t


def now_ms() -> int:
    return int(time.time() * 1000)


#: Longest namespace, table or tag name and commit id the metastore columns hold.
MAX_NAME_LENGTH = 255
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def check_name(kind: str, name: object) -> str:
    """``name`` if it fits a name column on every metastore, else :class:`InvalidName`."""
    if (not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH
            or _CONTROL_CHARACTERS.search(name)):
        shown = name if not isinstance(name, str) or len(name) <= 80 else name[:80] + "..."
        raise InvalidName(
            f"Invalid {kind} name {shown!r}: use 1 to {MAX_NAME_LENGTH} characters, none of them "
            "a control character (NUL, newline, tab)")
    return name


def check_commit_id(commit_id: object) -> None:
    """Refuse a commit id no metastore can store (PostgreSQL text cannot hold NUL)."""
    if commit_id is None:
        return
    if (not isinstance(commit_id, str) or not commit_id or len(commit_id) > MAX_NAME_LENGTH
            or "\x00" in commit_id):
        shown = commit_id if not isinstance(commit_id, str) or len(commit_id) <= 80 \
            else commit_id[:80] + "..."
        raise ValidationError(
            f"Invalid commit_id {shown!r}: use a string of 1 to {MAX_NAME_LENGTH} characters "
            "without NUL; nothing was written")


@dataclass(frozen=True)
class TableRecord:
    table_id: int
    namespace: str
    name: str
    location: str
    current_schema_id: int
    current_snapshot_id: int | None
    last_field_id: int
    partition_by: tuple[str, ...]
    primary_key: tuple[str, ...]
    buckets: int | None
    properties: dict[str, str]
    created_at: int

    @property
    def full_name(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True)
class NewFile:
    """A data file written by a writer, to be recorded by a commit."""

    path: str  # relative to the table location
    schema_id: int
    row_count: int
    file_size: int
    stats: str = "{}"
    partition_path: str | None = None
    partition_values: str | None = None  # JSON, see arrowlake.io.stats
    bucket: int | None = None
    content: str = "data"
    key_min: str | None = None
    key_max: str | None = None
    seq_min: int | None = None
    seq_max: int | None = None


@dataclass(frozen=True)
class CommitResult:
    snapshot_id: int | None
    attempts: int = 1
    duplicate: bool = False  # a snapshot with the same commit id existed already


@dataclass(frozen=True)
class SnapshotChange:
    """What one commit does, described as data (so it can be retried on a new base)."""

    kind: str
    schema_id: int
    add: Sequence[NewFile] = ()
    remove: Sequence[int] = ()  # file ids
    removed_rows: int = 0
    commit_id: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    # Called inside the transaction when other commits landed after ``base``; gets the files they
    # added and raises CommitConflict if this change can no longer be applied on top of them.
    on_rebase: Callable[[pa.Table], None] | None = None
    # Changelog files of primary-key tables (changelog producers ``input`` and ``lookup``):
    # recorded with content ``changelog`` and read by this snapshot only, so they are never
    # part of a table's live files and expire with the snapshot that wrote them.
    changelog: Sequence[NewFile] = ()


FILE_COLUMNS = (
    "file_id", "path", "partition_id", "bucket", "added_snapshot", "removed_snapshot",
    "schema_id", "row_count", "file_size", "content", "stats", "key_min", "key_max",
    "seq_min", "seq_max",
)
_FILE_TYPES = {
    "file_id": pa.int64(), "path": pa.string(), "partition_id": pa.int64(),
    "bucket": pa.int32(), "added_snapshot": pa.int64(), "removed_snapshot": pa.int64(),
    "schema_id": pa.int32(), "row_count": pa.int64(), "file_size": pa.int64(),
    "content": pa.string(), "stats": pa.string(), "key_min": pa.string(),
    "key_max": pa.string(), "seq_min": pa.int64(), "seq_max": pa.int64(),
}
FILE_SCHEMA = pa.schema([(c, _FILE_TYPES[c]) for c in FILE_COLUMNS])


def _rows_to_table(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.Table:
    # Transposing with zip keeps the per-row work inside the interpreter's C code.
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.table([pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)],
                    schema=schema)


def sqlite_read_only_uri(url: str) -> str | None:
    """A read-only SQLite URI for the database file of ``url`` if this process cannot write it.

    Checked up front: SQLite would otherwise fail only at the first write (after the commit
    retries), and cannot even read a WAL database whose folder it may not create ``-shm`` in.
    """
    parsed = sa.engine.make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:" \
            or path.startswith("file:"):
        return None
    folder = os.path.dirname(os.path.abspath(path)) or "."
    folder_writable = os.access(folder, os.W_OK)
    if not os.path.exists(path):
        if os.path.isdir(folder) and not folder_writable:
            raise ReadOnlyLake(
                f"There is no lake database at {path}, and its folder is read-only here, so "
                "none can be created")
        return None
    if folder_writable and os.access(path, os.W_OK):
        return None
    # mode=ro still follows the WAL of a writer that may exist (who has the -wal and -shm
    # files). Without a WAL file and a folder no one here may create one in, the database
    # holds every commit; immutable=1 reads it without the shared-memory file.
    if folder_writable or os.path.exists(path + "-wal"):
        mode = "mode=ro"
    else:
        mode = "immutable=1"
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?{mode}"


def _display_location(url: str) -> str:
    """Where the metastore is, for messages: the database file, or the URL without password."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database or ":memory:"
        return path[len("file:"):] if path.startswith("file:") else path
    return parsed.render_as_string(hide_password=True)


#: Every engine of this process, so that a forked child (a DataLoader worker, say) drops the
#: parent's pooled connections instead of sharing their sockets and SQLite handles.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _forget_parent_connections() -> None:
    for engine in list(_ENGINES):
        engine.dispose(close=False)  # the parent keeps using them; the child opens its own


os.register_at_fork(after_in_child=_forget_parent_connections)


def _make_engine(url: str, read_only: bool, read_only_uri: str | None = None) -> Engine:
    engine = _new_engine(url, read_only, read_only_uri)
    _ENGINES.add(engine)
    return engine


def _new_engine(url: str, read_only: bool, read_only_uri: str | None = None) -> Engine:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite"):
        if read_only_uri is not None:
            # Opened by hand: a URL would not carry a quoted path through to SQLite intact.
            engine = sa.create_engine(
                "sqlite://", poolclass=sa.pool.QueuePool,
                creator=lambda: sqlite3.connect(read_only_uri, uri=True, timeout=120,
                                                check_same_thread=False))
        else:
            engine = sa.create_engine(url, connect_args={"timeout": 120})

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control from the driver so BEGIN IMMEDIATE can be issued: a
            # writer then holds the write lock from its first read, and two writers never
            # deadlock upgrading shared locks.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            if not read_only:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            write = conn.get_execution_options().get("arrowlake_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def _is_read_only_error(exc: DBAPIError) -> bool:
    """Whether the database refused a write because it is read-only (not a transient error)."""
    orig = exc.orig
    name = getattr(orig, "sqlite_errorname", None)
    if isinstance(name, str):
        return name.startswith("SQLITE_READONLY")
    if "attempt to write a readonly database" in str(orig):
        return True
    # PostgreSQL: read_only_sql_transaction (a standby, default_transaction_read_only) and
    # insufficient_privilege (a role that may only SELECT).
    return getattr(orig, "sqlstate", None) in ("25006", "42501")


class Metastore:
    """Namespaces, tables, snapshots and files in a SQL database.

    An SQLite database file this process may not write is opened read-only: reads work, every
    write raises :class:`ReadOnlyLake` at once.
    """

    def __init__(self, url: str, *, commit_retries: int = 100) -> None:
        self.url = url
        sqlite = url.startswith("sqlite")
        read_only_uri = sqlite_read_only_uri(url) if sqlite else None
        self.read_only = read_only_uri is not None or (
            sqlite and ("mode=ro" in url or "immutable=1" in url))
        self.engine = _make_engine(url, self.read_only, read_only_uri)
        #: Where the metastore is, for messages: the database file, or the URL without password.
        self.location = _display_location(url)
        self.commit_retries = commit_retries
        self._schema_cache: dict[tuple[int, int], pa.Schema] = {}
        self._init_database()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    # -- connections ---------------------------------------------------------------------------

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    def _read_only_error(self) -> ReadOnlyLake:
        return ReadOnlyLake(
            f"The lake's metastore {self.location} is read-only here: reads work, but writes "
            "(commits, schema changes, tags, creating or dropping tables) need write access to "
            "the database (and, for SQLite, to its folder)")

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        if self.read_only:
            raise self._read_only_error()
        try:
            with self.engine.connect().execution_options(arrowlake_write=True) as conn, \
                    conn.begin():
                yield conn
        except DBAPIError as exc:
            if _is_read_only_error(exc):
                raise self._read_only_error() from exc
            raise

    def _stored_version(self) -> int | None:
        try:
            with self._read() as conn:
                row = conn.execute(
                    sa.select(t.meta_info.c.value).where(t.meta_info.c.key == "version")
                ).first()
        except OperationalError:  # no al_meta table: not a lake's metastore (yet)
            return None
        return None if row is None else int(row[0])

    def _init_database(self) -> None:
        if self.read_only:
            version = self._stored_version()
            if version is None:
                raise ReadOnlyLake(
                    f"{self.location} holds no arrowlake metastore, and it is read-only here, so "
                    "none can be created")
            if version < t.SCHEMA_VERSION:
                raise ReadOnlyLake(
                    f"The metastore {self.location} has schema version {version} and "
                    f"must be upgraded to {t.SCHEMA_VERSION} before this arrowlake can read "
                    "it, which needs write access: open it once where it is writable")
        else:
            version = self._create_tables()
            if version < t.SCHEMA_VERSION:
                self._migrate()
        if version > t.SCHEMA_VERSION:
            raise MetastoreError(
                f"The metastore at {self.engine.url!r} has schema version {version}, newer than "
                f"this arrowlake understands ({t.SCHEMA_VERSION}): upgrade arrowlake"
            )

    def _create_tables(self) -> int:
        """Create missing tables; the stored schema version (the current one when new)."""
        for attempt in range(20):
            try:
                with self._write() as conn:
                    t.metadata.create_all(conn, checkfirst=True)
                    row = conn.execute(
                        sa.select(t.meta_info.c.value).where(t.meta_info.c.key == "version")
                    ).first()
                    if row is None:
                        conn.execute(t.meta_info.insert().values(key="version",
                                                                 value=str(t.SCHEMA_VERSION)))
                        return t.SCHEMA_VERSION
                    return int(row[0])
            except (IntegrityError, OperationalError, DBAPIError):
                # Another process is creating the same tables right now.
                if attempt == 19:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    # -- migrations ----------------------------------------------------------------------------

    @contextmanager
    def _migration(self) -> Iterator[Connection]:
        """One write transaction for a migration; on SQLite with foreign keys off.

        Rebuilding a parent table on SQLite drops it, and with foreign keys on that drop would
        cascade into every row referencing it. The pragma is ignored inside a transaction, so it
        is set on the driver connection before the transaction and restored after it;
        ``foreign_key_check`` proves the rebuilt tables consistent before the commit.
        """
        try:
            with self._migration_transaction() as conn:
                yield conn
        except DBAPIError as exc:
            if _is_read_only_error(exc):
                raise self._read_only_error() from exc
            raise

    @contextmanager
    def _migration_transaction(self) -> Iterator[Connection]:
        with self.engine.connect().execution_options(arrowlake_write=True) as conn:
            raw = conn.connection.driver_connection if self.dialect == "sqlite" else None
            if raw is not None:
                raw.execute("PRAGMA foreign_keys=OFF")
            try:
                with conn.begin():
                    yield conn
                    if raw is not None:
                        bad = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                        if bad:
                            raise MetastoreError(
                                f"Upgrading the metastore found rows without their table: "
                                f"{bad[:5]}; nothing was changed")
            finally:
                if raw is not None:
                    raw.execute("PRAGMA foreign_keys=ON")

    def _migrate(self) -> None:
        """Bring an older database to :data:`tables.SCHEMA_VERSION`, in one transaction."""
        with self._migration() as conn:
            version = int(conn.execute(
                sa.select(t.meta_info.c.value).where(t.meta_info.c.key == "version")
                .with_for_update()).scalar_one())
            if version >= t.SCHEMA_VERSION:
                return  # another process upgraded it meanwhile
            if version == 1:
                self._migrate_1_to_2(conn)
            if version <= 2:
                # Version 3 only adds a table (``create_all`` made it already, unless another
                # process raced this one): nothing else changes.
                t.consumers.create(conn, checkfirst=True)
            conn.execute(t.meta_info.update().where(t.meta_info.c.key == "version")
                         .values(value=str(t.SCHEMA_VERSION)))

    def _migrate_1_to_2(self, conn: Connection) -> None:
        if self.dialect == "sqlite":
            # AUTOINCREMENT can only be declared by CREATE TABLE: rebuild the three tables under
            # their DDL of now, keeping every id. Copying the rows sets sqlite_sequence to the
            # highest id present; ids freed before the upgrade cannot be known (a commit still
            # refuses to remove a file added after the snapshot its plan read).
            for table in t.AUTOINCREMENT_TABLES:
                ddl = str(sa.schema.CreateTable(table).compile(dialect=conn.dialect))
                staged = f"{table.name}_v2"
                header = f"CREATE TABLE {table.name} ("
                if not ddl.lstrip().startswith(header):
                    raise MetastoreError(f"Unexpected DDL for {table.name}: {ddl[:80]!r}")
                conn.exec_driver_sql(ddl.replace(header, f"CREATE TABLE {staged} (", 1))
                columns = ", ".join(c.name for c in table.columns)
                conn.exec_driver_sql(
                    f"INSERT INTO {staged} ({columns}) SELECT {columns} FROM {table.name}")
                conn.exec_driver_sql(f"DROP TABLE {table.name}")
                conn.exec_driver_sql(f"ALTER TABLE {staged} RENAME TO {table.name}")
                for index in table.indexes:
                    conn.execute(sa.schema.CreateIndex(index))
        s = t.snapshots
        for column in (s.c.write_token, s.c.superseded_at):
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {s.name} ADD COLUMN {column.name} {kind}")
        for index in s.indexes:
            if index.name == "al_snapshots_token":
                conn.execute(sa.schema.CreateIndex(index))
        # A snapshot stopped being current when its child was committed. If the child has
        # expired, that time is lost: the snapshot's own time is recorded, so time travel to
        # a moment in the lost interval reports the snapshot as expired rather than guessing.
        child = s.alias("child")
        child_time = sa.select(sa.func.min(child.c.committed_at)).where(
            (child.c.table_id == s.c.table_id) & (child.c.parent_id == s.c.snapshot_id)
        ).scalar_subquery()
        current = sa.select(t.tables.c.current_snapshot_id).where(
            t.tables.c.table_id == s.c.table_id).scalar_subquery()
        conn.execute(s.update().where(
            sa.func.coalesce(current, -1) != s.c.snapshot_id
        ).values(superseded_at=sa.func.coalesce(child_time, s.c.committed_at)))

    # -- namespaces ----------------------------------------------------------------------------

    def create_namespace(self, name: str, *, exist_ok: bool = True,
                         properties: dict[str, str] | None = None) -> None:
        check_name("namespace", name)
        try:
            with self._write() as conn:
                exists = conn.execute(
                    sa.select(t.namespaces.c.name).where(t.namespaces.c.name == name)
                ).first()
                if exists is not None:
                    if not exist_ok:
                        raise TableAlreadyExists(f"Namespace '{name}' exists already")
                    return
                conn.execute(t.namespaces.insert().values(
                    name=name, properties=json.dumps(properties or {}), created_at=now_ms()))
        except IntegrityError:
            if not exist_ok:
                raise TableAlreadyExists(f"Namespace '{name}' exists already") from None

    def namespaces(self) -> list[str]:
        with self._read() as conn:
            rows = conn.execute(sa.select(t.namespaces.c.name).order_by(t.namespaces.c.name))
            return [r[0] for r in rows]

    def drop_namespace(self, name: str) -> None:
        with self._write() as conn:
            count = conn.execute(
                sa.select(sa.func.count()).select_from(t.tables)
                .where(t.tables.c.namespace == name)
            ).scalar_one()
            if count:
                raise MetastoreError(
                    f"Namespace '{name}' still holds {count} tables: drop them first"
                )
            res = conn.execute(t.namespaces.delete().where(t.namespaces.c.name == name))
            if res.rowcount == 0:
                raise NamespaceNotFound(f"Namespace '{name}' does not exist")

    # -- tables --------------------------------------------------------------------------------

    def create_table(
        self,
        namespace: str,
        name: str,
        *,
        location: str,
        schema: pa.Schema,
        last_field_id: int,
        partition_by: Sequence[str] = (),
        primary_key: Sequence[str] = (),
        buckets: int | None = None,
        properties: dict[str, str] | None = None,
    ) -> TableRecord:
        check_name("table", name)
        self.create_namespace(namespace)
        created = now_ms()
        try:
            with self._write() as conn:
                exists = conn.execute(
                    sa.select(t.tables.c.table_id).where(
                        (t.tables.c.namespace == namespace) & (t.tables.c.name == name))
                ).first()
                if exists is not None:
                    raise TableAlreadyExists(f"Table '{namespace}.{name}' exists already")
                table_id = conn.execute(t.tables.insert().values(
                    namespace=namespace, name=name, location=location, current_schema_id=0,
                    current_snapshot_id=None, last_snapshot_id=0, last_field_id=last_field_id,
                    partition_by=json.dumps(list(partition_by)),
                    primary_key=json.dumps(list(primary_key)), buckets=buckets,
                    properties=json.dumps(properties or {}), created_at=created,
                )).inserted_primary_key[0]  # type: ignore[index]
                conn.execute(t.schemas.insert().values(
                    table_id=table_id, schema_id=0, arrow_schema=schemas_mod.serialize(schema),
                    created_at=created))
        except IntegrityError:
            raise TableAlreadyExists(f"Table '{namespace}.{name}' exists already") from None
        return self.load_table(namespace, name)

    @staticmethod
    def _record(row: Any) -> TableRecord:
        return TableRecord(
            table_id=row.table_id, namespace=row.namespace, name=row.name, location=row.location,
            current_schema_id=row.current_schema_id, current_snapshot_id=row.current_snapshot_id,
            last_field_id=row.last_field_id, partition_by=tuple(json.loads(row.partition_by)),
            primary_key=tuple(json.loads(row.primary_key)), buckets=row.buckets,
            properties=json.loads(row.properties), created_at=row.created_at,
        )

    def load_table(self, namespace: str, name: str) -> TableRecord:
        check_name("namespace", namespace)
        check_name("table", name)
        with self._read() as conn:
            row = conn.execute(sa.select(t.tables).where(
                (t.tables.c.namespace == namespace) & (t.tables.c.name == name))).first()
        if row is None:
            raise TableNotFound(f"Table '{namespace}.{name}' does not exist")
        return self._record(row)

    def load_table_by_id(self, table_id: int) -> TableRecord:
        with self._read() as conn:
            row = conn.execute(sa.select(t.tables).where(t.tables.c.table_id == table_id)).first()
        if row is None:
            raise self._dropped(table_id)
        return self._record(row)

    def list_tables(self, namespace: str | None = None) -> list[tuple[str, str]]:
        query = sa.select(t.tables.c.namespace, t.tables.c.name).order_by(
            t.tables.c.namespace, t.tables.c.name)
        if namespace is not None:
            query = query.where(t.tables.c.namespace == namespace)
        with self._read() as conn:
            return [(r[0], r[1]) for r in conn.execute(query)]

    def table_locations(self) -> list[tuple[int, str, str]]:
        """``(table_id, "ns.table", location)`` of every table, in one query."""
        query = sa.select(t.tables.c.table_id, t.tables.c.namespace, t.tables.c.name,
                          t.tables.c.location)
        with self._read() as conn:
            return [(r[0], f"{r[1]}.{r[2]}", r[3]) for r in conn.execute(query)]

    def database_file(self) -> str | None:
        """The SQLite database file of this metastore (None for a server database)."""
        if self.engine.dialect.name != "sqlite":
            return None
        path = self.engine.url.database
        if not path or path == ":memory:" or path.startswith("file:"):
            return None
        return str(path)

    @staticmethod
    def _dropped(table_id: int) -> TableNotFound:
        return TableNotFound(
            f"Table with id {table_id} does not exist: it was dropped (a table created since "
            "under the same name is another table); get a new handle with lake.table(name)")

    def _lock_table(self, conn: Connection, table_id: int) -> Any:
        """The table's row, locked for this write transaction; TableNotFound once dropped."""
        row = conn.execute(sa.select(t.tables).where(t.tables.c.table_id == table_id)
                           .with_for_update()).first()
        if row is None:
            raise self._dropped(table_id)
        return row

    def drop_table(self, table_id: int) -> None:
        with self._write() as conn:
            self._lock_table(conn, table_id)
            for tbl in (t.files, t.partitions, t.tags, t.consumers, t.snapshots, t.schemas):
                conn.execute(tbl.delete().where(tbl.c.table_id == table_id))
            conn.execute(t.tables.delete().where(t.tables.c.table_id == table_id))
        # Ids are never reused, so no other table can hit these entries; free them anyway.
        for key in [k for k in self._schema_cache if k[0] == table_id]:
            self._schema_cache.pop(key, None)

    def rename_table(self, table_id: int, namespace: str, name: str) -> None:
        check_name("table", name)
        self.create_namespace(namespace)
        try:
            with self._write() as conn:
                self._lock_table(conn, table_id)
                conn.execute(t.tables.update().where(t.tables.c.table_id == table_id)
                             .values(namespace=namespace, name=name))
        except IntegrityError:
            raise TableAlreadyExists(f"Table '{namespace}.{name}' exists already") from None

    def update_properties(self, table_id: int, changes: dict[str, str],
                          check: Callable[[dict[str, str]], None] | None = None
                          ) -> dict[str, str]:
        """Merge ``changes`` into the table's properties as they are when its row is locked
        (so a concurrent change to other properties, such as a rename rewriting
        ``fields.<col>.*``, is kept), after ``check(current)`` accepts them; returns the
        merged properties."""
        with self._write() as conn:
            row = self._lock_table(conn, table_id)
            current = json.loads(row.properties)
            if check is not None:
                check(current)
            merged = {**current, **changes}
            conn.execute(t.tables.update().where(t.tables.c.table_id == table_id)
                         .values(properties=json.dumps(merged)))
        return merged

    # -- schemas -------------------------------------------------------------------------------

    def schema(self, table_id: int, schema_id: int) -> pa.Schema:
        key = (table_id, schema_id)
        cached = self._schema_cache.get(key)
        if cached is None:
            with self._read() as conn:
                data = conn.execute(sa.select(t.schemas.c.arrow_schema).where(
                    (t.schemas.c.table_id == table_id) & (t.schemas.c.schema_id == schema_id)
                )).scalar_one()
            cached = schemas_mod.deserialize(data)
            self._schema_cache[key] = cached
        return cached

    def add_schema(self, table_id: int, schema: pa.Schema, *, expected_schema_id: int,
                   last_field_id: int, properties: dict[str, str] | None = None,
                   expected_properties: dict[str, str] | None = None) -> int:
        """Make ``schema`` the table's current schema, if it is still at ``expected_schema_id``
        (and, in the same transaction, ``properties`` its properties when given: they were
        derived from ``expected_properties``, so a concurrent property change is a
        conflict rather than silently overwritten)."""
        values: dict[str, Any] = {"last_field_id": last_field_id}
        if properties is not None:
            values["properties"] = json.dumps(properties)
        with self._write() as conn:
            row = self._lock_table(conn, table_id)
            if properties is not None and expected_properties is not None \
                    and json.loads(row.properties) != expected_properties:
                raise CommitConflict(
                    "The table's properties were changed by another writer meanwhile; reload "
                    "the table and apply the schema change again")
            new_id = conn.execute(sa.select(sa.func.max(t.schemas.c.schema_id)).where(
                t.schemas.c.table_id == table_id)).scalar_one() + 1
            res = conn.execute(
                t.tables.update()
                .where((t.tables.c.table_id == table_id)
                       & (t.tables.c.current_schema_id == expected_schema_id))
                .values(current_schema_id=new_id, **values))
            if res.rowcount != 1:
                raise CommitConflict(
                    "The table's schema was changed by another writer meanwhile; reload the "
                    "table and apply the change again")
            conn.execute(t.schemas.insert().values(
                table_id=table_id, schema_id=new_id, arrow_schema=schemas_mod.serialize(schema),
                created_at=now_ms()))
        return int(new_id)

    # -- snapshots -----------------------------------------------------------------------------

    _SNAPSHOT_COLUMNS = ("snapshot_id", "parent_id", "kind", "committed_at", "schema_id",
                         "commit_id", "added_files", "removed_files", "added_rows",
                         "removed_rows", "total_files", "total_rows", "summary")

    def snapshots(self, table_id: int) -> pa.Table:
        cols = [t.snapshots.c[c] for c in self._SNAPSHOT_COLUMNS]
        with self._read() as conn:
            rows = conn.execute(sa.select(*cols).where(t.snapshots.c.table_id == table_id)
                                .order_by(t.snapshots.c.snapshot_id)).all()
        schema = pa.schema([
            ("snapshot_id", pa.int64()), ("parent_id", pa.int64()), ("kind", pa.string()),
            ("committed_at", pa.int64()), ("schema_id", pa.int32()), ("commit_id", pa.string()),
            ("added_files", pa.int64()), ("removed_files", pa.int64()),
            ("added_rows", pa.int64()), ("removed_rows", pa.int64()),
            ("total_files", pa.int64()), ("total_rows", pa.int64()), ("summary", pa.string()),
        ])
        table = _rows_to_table(rows, schema)
        committed = table.column("committed_at").cast(pa.timestamp("ms", tz="UTC"))
        return table.set_column(3, pa.field("committed_at", committed.type), committed)

    def snapshot(self, table_id: int, snapshot_id: int) -> dict[str, Any]:
        with self._read() as conn:
            row = conn.execute(sa.select(t.snapshots).where(
                (t.snapshots.c.table_id == table_id)
                & (t.snapshots.c.snapshot_id == snapshot_id))).first()
        if row is None:
            raise SnapshotNotFound(
                f"Snapshot {snapshot_id} does not exist (never committed, or expired)")
        return dict(row._mapping)

    def snapshot_as_of(self, table_id: int, at_ms: int) -> int:
        """The snapshot that was the table's current one at ``at_ms``.

        Commit times never decrease along the chain of snapshots (see ``_commit_once``), so it
        is the newest snapshot committed at or before ``at_ms``. When that one has expired, the
        newest retained one before it records (``superseded_at``) that it had been replaced by
        then: :class:`SnapshotNotFound`, never an older snapshot.
        """
        s = t.snapshots.c
        with self._read() as conn:
            row = conn.execute(
                sa.select(s.snapshot_id, s.superseded_at).where(
                    (s.table_id == table_id) & (s.committed_at <= at_ms))
                .order_by(s.snapshot_id.desc()).limit(1)).first()
        if row is None:
            raise SnapshotNotFound(
                "The table has no snapshot committed at or before that time (it was empty, or "
                "the snapshots of that time were expired)")
        if row[1] is not None and int(row[1]) <= at_ms:
            raise SnapshotNotFound(
                f"The snapshot that was current at that time has expired (snapshot {row[0]} is "
                "the newest one retained from before it, and it had been replaced by then); tag "
                "snapshots to keep them for time travel")
        return int(row[0])

    def current_snapshot_id(self, table_id: int) -> int | None:
        with self._read() as conn:
            row = conn.execute(sa.select(t.tables.c.current_snapshot_id).where(
                t.tables.c.table_id == table_id)).first()
        if row is None:
            raise self._dropped(table_id)
        return None if row[0] is None else int(row[0])

    # -- tags ----------------------------------------------------------------------------------

    def create_tag(self, table_id: int, name: str, snapshot_id: int) -> None:
        check_name("tag", name)
        try:
            with self._write() as conn:
                self._lock_table(conn, table_id)
                exists = conn.execute(sa.select(t.snapshots.c.snapshot_id).where(
                    (t.snapshots.c.table_id == table_id)
                    & (t.snapshots.c.snapshot_id == snapshot_id))).first()
                if exists is None:
                    raise SnapshotNotFound(
                        f"Snapshot {snapshot_id} does not exist (never committed, or expired)")
                conn.execute(t.tags.insert().values(table_id=table_id, name=name,
                                                    snapshot_id=snapshot_id,
                                                    created_at=now_ms()))
        except IntegrityError:
            raise TableAlreadyExists(f"Tag '{name}' exists already") from None

    def _check_table(self, table_id: int) -> None:
        with self._read() as conn:
            row = conn.execute(sa.select(t.tables.c.table_id).where(
                t.tables.c.table_id == table_id)).first()
        if row is None:
            raise self._dropped(table_id)

    def tag(self, table_id: int, name: str) -> int:
        check_name("tag", name)
        with self._read() as conn:
            row = conn.execute(sa.select(t.tags.c.snapshot_id).where(
                (t.tags.c.table_id == table_id) & (t.tags.c.name == name))).first()
        if row is None:
            self._check_table(table_id)
            raise TagNotFound(f"Tag '{name}' does not exist")
        return int(row[0])

    def tags(self, table_id: int) -> dict[str, int]:
        with self._read() as conn:
            rows = conn.execute(sa.select(t.tags.c.name, t.tags.c.snapshot_id).where(
                t.tags.c.table_id == table_id).order_by(t.tags.c.name))
            return {r[0]: int(r[1]) for r in rows}

    def drop_tag(self, table_id: int, name: str) -> None:
        check_name("tag", name)
        with self._write() as conn:
            self._lock_table(conn, table_id)
            res = conn.execute(t.tags.delete().where(
                (t.tags.c.table_id == table_id) & (t.tags.c.name == name)))
        if res.rowcount == 0:
            raise TagNotFound(f"Tag '{name}' does not exist")

    # -- files ---------------------------------------------------------------------------------

    def partitions(self, table_id: int) -> list[tuple[int, str, str]]:
        """``(partition_id, path, values_json)`` for every partition the table ever had."""
        with self._read() as conn:
            rows = conn.execute(sa.select(
                t.partitions.c.partition_id, t.partitions.c.path,
                t.partitions.c.partition_values).where(t.partitions.c.table_id == table_id)
                .order_by(t.partitions.c.partition_id))
            return [(int(r[0]), r[1], r[2]) for r in rows]

    def live_files(self, table_id: int, snapshot_id: int | None,
                   partition_ids: Sequence[int] | None = None,
                   buckets: Sequence[int] | None = None) -> pa.Table:
        """The data files of ``snapshot_id`` as an Arrow table (:data:`FILE_SCHEMA`)."""
        if snapshot_id is None:
            return FILE_SCHEMA.empty_table()
        c = t.files.c
        query = sa.select(*[c[n] for n in FILE_COLUMNS]).where(
            (c.table_id == table_id) & (c.added_snapshot <= snapshot_id)
            & ((c.removed_snapshot.is_(None)) | (c.removed_snapshot > snapshot_id))
            & (c.content == "data"))
        if partition_ids is not None:
            if not partition_ids:
                return FILE_SCHEMA.empty_table()
            query = query.where(c.partition_id.in_(list(partition_ids)))
        if buckets is not None:
            query = query.where(c.bucket.in_(list(buckets)))
        with self._read() as conn:
            rows = conn.execute(query.order_by(c.file_id)).all()
        return _rows_to_table(rows, FILE_SCHEMA)

    def files_added_between(self, conn: Connection | None, table_id: int, after: int | None,
                            upto: int) -> pa.Table:
        """Files added by snapshots in ``(after, upto]``, removed since or not."""
        c = t.files.c
        query = sa.select(*[c[n] for n in FILE_COLUMNS]).where(
            (c.table_id == table_id) & (c.added_snapshot <= upto) & (c.content == "data"))
        if after is not None:
            query = query.where(c.added_snapshot > after)
        if conn is None:
            with self._read() as own:
                rows = own.execute(query.order_by(c.file_id)).all()
        else:
            rows = conn.execute(query.order_by(c.file_id)).all()
        return _rows_to_table(rows, FILE_SCHEMA)

    def all_file_paths(self, table_id: int) -> list[str]:
        """Every file any retained snapshot may read (live or removed but not yet expired)."""
        with self._read() as conn:
            rows = conn.execute(sa.select(t.files.c.path).where(t.files.c.table_id == table_id))
            return [r[0] for r in rows]

    # -- commits -------------------------------------------------------------------------------

    def commit(self, table_id: int, base_snapshot_id: int | None,
               change: SnapshotChange) -> CommitResult:
        """Record ``change`` as the table's next snapshot, atomically.

        Runs one transaction: if other commits landed after ``base_snapshot_id``, the change is
        rebased (``on_rebase`` decides whether that is allowed); files to remove must still be
        live, else :class:`CommitConflict`; then the snapshot row, its file rows and the table's
        current snapshot are written. A lost race (two writers taking the same snapshot id) is
        detected by the snapshots primary key and the compare-and-set on ``al_tables``, and
        retried with backoff.

        Every call records a random write token with its snapshot. An OperationalError can come
        after the database committed (the reply to COMMIT was lost), so a retry first looks for
        its own token and, when that attempt landed, returns its snapshot instead of committing
        the change a second time. A table dropped meanwhile raises :class:`TableNotFound`, a
        read-only database :class:`ReadOnlyLake`; neither is retried.
        """
        check_commit_id(change.commit_id)
        token = uuid.uuid4().hex
        attempts = 0
        while True:
            attempts += 1
            try:
                with self._write() as conn:
                    result = self._commit_once(conn, table_id, base_snapshot_id, change, token,
                                               attempts > 1)
                    if self.dialect == "postgresql" and not result[1]:
                        # Delivered at COMMIT, to streams in every process (signals.listen).
                        conn.execute(sa.select(sa.func.pg_notify(signals.CHANNEL,
                                                                 str(table_id))))
                if not result[1]:
                    signals.publish(self.url, table_id)
                return CommitResult(result[0], attempts, result[1])
            except CommitConflict:
                raise
            except (DBAPIError, _LostRace) as exc:
                retryable = isinstance(exc, (IntegrityError, OperationalError, _LostRace)) or (
                    isinstance(exc, DBAPIError) and exc.connection_invalidated)
                if not retryable:
                    raise
                if attempts >= self.commit_retries:
                    landed = self._landed(table_id, token)
                    if landed is not None:
                        return CommitResult(landed, attempts)
                    raise CommitConflict(
                        f"Gave up committing to table {table_id} after {attempts} attempts: "
                        f"{exc}") from exc
                time.sleep(min(0.5, 0.002 * 2 ** min(attempts, 8)) * random.random())

    def _landed(self, table_id: int, token: str, conn: Connection | None = None) -> int | None:
        """The snapshot an attempt with ``token`` committed, if one did."""
        query = sa.select(t.snapshots.c.snapshot_id).where(
            (t.snapshots.c.table_id == table_id) & (t.snapshots.c.write_token == token))
        if conn is None:
            with self._read() as own:
                row = own.execute(query).first()
        else:
            row = conn.execute(query).first()
        return None if row is None else int(row[0])

    def _commit_once(self, conn: Connection, table_id: int, base: int | None,
                     change: SnapshotChange, token: str | None = None,
                     retrying: bool = False) -> tuple[int, bool]:
        tbl = t.tables.c
        # The row lock also waits out an earlier attempt of this commit that the database may
        # still be finishing, so the token lookup below sees whether it landed.
        row = conn.execute(sa.select(tbl.current_snapshot_id, tbl.last_snapshot_id).where(
            tbl.table_id == table_id).with_for_update()).first()
        if row is None:
            raise self._dropped(table_id)
        current, last = row[0], int(row[1])
        if retrying and token is not None:
            mine = self._landed(table_id, token, conn)
            if mine is not None:
                return mine, False
        if change.commit_id is not None:
            dup = conn.execute(sa.select(t.snapshots.c.snapshot_id).where(
                (t.snapshots.c.table_id == table_id)
                & (t.snapshots.c.commit_id == change.commit_id))).first()
            if dup is not None:
                return int(dup[0]), True
        if current != base and change.on_rebase is not None and current is not None:
            change.on_rebase(self.files_added_between(conn, table_id, base, current))
        new_id = last + 1
        if change.remove:
            # Only files that were live in the base snapshot the change was planned on: a file
            # committed after it is never one the plan read, whatever its id.
            res = conn.execute(
                t.files.update()
                .where((t.files.c.table_id == table_id)
                       & t.files.c.file_id.in_(list(change.remove))
                       & (t.files.c.added_snapshot <= (-1 if base is None else base))
                       & t.files.c.removed_snapshot.is_(None))
                .values(removed_snapshot=new_id))
            if res.rowcount != len(change.remove):
                raise CommitConflict(
                    f"Another commit removed {len(change.remove) - res.rowcount} of the files "
                    f"this {change.kind} read; the table is unchanged. Retry the {change.kind} "
                    "on the current snapshot.")
        partition_ids = self._partition_ids(conn, table_id, [*change.add, *change.changelog])
        if change.add:
            conn.execute(t.files.insert(), [
                dict(table_id=table_id, path=f.path, partition_id=partition_ids.get(
                    f.partition_path), bucket=f.bucket, added_snapshot=new_id,
                    removed_snapshot=None, schema_id=f.schema_id, row_count=f.row_count,
                    file_size=f.file_size, content=f.content, stats=f.stats, key_min=f.key_min,
                    key_max=f.key_max,
                    # A new run's versions are ordered by the snapshot that commits them;
                    # compaction output keeps the sequence range of its inputs.
                    seq_min=new_id if f.seq_min is None else f.seq_min,
                    seq_max=new_id if f.seq_max is None else f.seq_max)
                for f in change.add])
        if change.changelog:
            conn.execute(t.files.insert(), [
                dict(table_id=table_id, path=f.path, partition_id=partition_ids.get(
                    f.partition_path), bucket=f.bucket, added_snapshot=new_id,
                    removed_snapshot=new_id + 1, schema_id=f.schema_id, row_count=f.row_count,
                    file_size=f.file_size, content="changelog", stats=f.stats,
                    key_min=f.key_min, key_max=f.key_max, seq_min=new_id, seq_max=new_id)
                for f in change.changelog])
        totals = (0, 0)
        committed_at = now_ms()
        if current is not None:
            s = t.snapshots.c
            prev = conn.execute(sa.select(s.total_files, s.total_rows, s.committed_at)
                                .where((s.table_id == table_id)
                                       & (s.snapshot_id == current))).first()
            if prev is not None:
                totals = (int(prev[0]), int(prev[1]))
                # Commit times never go backwards along the chain, even when writers' clocks
                # disagree: time travel relies on it.
                committed_at = max(committed_at, int(prev[2]))
            conn.execute(t.snapshots.update().where(
                (s.table_id == table_id) & (s.snapshot_id == current)
            ).values(superseded_at=committed_at))
        added_rows = sum(f.row_count for f in change.add)
        conn.execute(t.snapshots.insert().values(
            table_id=table_id, snapshot_id=new_id, parent_id=current, kind=change.kind,
            committed_at=committed_at, schema_id=change.schema_id, commit_id=change.commit_id,
            write_token=token,
            added_files=len(change.add), removed_files=len(change.remove),
            added_rows=added_rows, removed_rows=change.removed_rows,
            total_files=totals[0] + len(change.add) - len(change.remove),
            total_rows=totals[1] + added_rows - change.removed_rows,
            summary=json.dumps(change.summary)))
        res = conn.execute(t.tables.update().where(
            (tbl.table_id == table_id) & (tbl.last_snapshot_id == last)
        ).values(current_snapshot_id=new_id, last_snapshot_id=new_id))
        if res.rowcount != 1:
            raise _LostRace(f"another writer committed snapshot {new_id} first")
        return new_id, False

    def _partition_ids(self, conn: Connection, table_id: int,
                       add: Sequence[NewFile]) -> dict[str | None, int | None]:
        wanted = {f.partition_path: f.partition_values for f in add if f.partition_path is not None}
        ids: dict[str | None, int | None] = {None: None}
        if not wanted:
            return ids
        c = t.partitions.c
        paths = list(wanted)
        for chunk_start in range(0, len(paths), 500):
            chunk = paths[chunk_start:chunk_start + 500]
            for pid, path in conn.execute(sa.select(c.partition_id, c.path).where(
                    (c.table_id == table_id) & c.path.in_(chunk))):
                ids[path] = int(pid)
        missing = [p for p in paths if p not in ids]
        for path in missing:
            ids[path] = int(conn.execute(t.partitions.insert().values(
                table_id=table_id, path=path, partition_values=wanted[path]
            )).inserted_primary_key[0])  # type: ignore[index]
        return ids

    # -- streams -------------------------------------------------------------------------------

    _STREAM_SNAPSHOT_COLUMNS = ("snapshot_id", "parent_id", "kind", "committed_at",
                                "schema_id", "added_files", "removed_files", "summary")

    def snapshots_after(self, table_id: int, after: int | None, limit: int = 1000,
                        upto: int | None = None) -> list[dict[str, Any]]:
        """Retained snapshots with ids in ``(after, upto]``, oldest first, at most ``limit``.

        One range scan of the snapshots' primary key: what a stream's poll costs. Snapshot ids
        become visible in commit order (commits of one table are serialized by its row lock),
        so a poll never sees a snapshot before an older one.
        """
        s = t.snapshots.c
        query = sa.select(*[s[c] for c in self._STREAM_SNAPSHOT_COLUMNS]).where(
            s.table_id == table_id)
        if after is not None:
            query = query.where(s.snapshot_id > after)
        if upto is not None:
            query = query.where(s.snapshot_id <= upto)
        with self._read() as conn:
            rows = conn.execute(query.order_by(s.snapshot_id).limit(limit)).all()
        return [dict(r._mapping) for r in rows]

    def earliest_snapshot_id(self, table_id: int) -> int | None:
        with self._read() as conn:
            value = conn.execute(sa.select(sa.func.min(t.snapshots.c.snapshot_id)).where(
                t.snapshots.c.table_id == table_id)).scalar_one()
        return None if value is None else int(value)

    def files_changed(self, table_id: int, after: int, upto: int) -> tuple[pa.Table, pa.Table]:
        """Files added (data and changelog files: see ``content``), and data files removed, by
        the snapshots in ``(after, upto]`` (two indexed range queries)."""
        c = t.files.c
        cols = [c[n] for n in FILE_COLUMNS]
        in_table = c.table_id == table_id
        with self._read() as conn:
            added = conn.execute(sa.select(*cols).where(
                in_table & (c.added_snapshot > after) & (c.added_snapshot <= upto))
                .order_by(c.file_id)).all()
            removed = conn.execute(sa.select(*cols).where(
                in_table & (c.removed_snapshot > after) & (c.removed_snapshot <= upto)
                & (c.content == "data")).order_by(c.file_id)).all()
        return _rows_to_table(added, FILE_SCHEMA), _rows_to_table(removed, FILE_SCHEMA)

    def consumer_next_snapshot(self, table_id: int, consumer_id: str) -> int | None:
        """Where consumer ``consumer_id`` resumes (its first unprocessed snapshot), or None."""
        c = t.consumers.c
        with self._read() as conn:
            row = conn.execute(sa.select(c.next_snapshot).where(
                (c.table_id == table_id) & (c.consumer_id == consumer_id))).first()
        return None if row is None else int(row[0])

    def commit_consumer(self, table_id: int, consumer_id: str, next_snapshot: int) -> None:
        """Record, in one transaction, that ``consumer_id`` resumes at ``next_snapshot``."""
        check_name("consumer", consumer_id)
        c = t.consumers.c
        with self._write() as conn:
            self._lock_table(conn, table_id)
            now = now_ms()
            res = conn.execute(t.consumers.update().where(
                (c.table_id == table_id) & (c.consumer_id == consumer_id)
            ).values(next_snapshot=next_snapshot, committed_at=now))
            if res.rowcount == 0:
                # The table row lock serializes this with every other consumer commit of the
                # table, so no concurrent insert of the same id can slip in between.
                conn.execute(t.consumers.insert().values(
                    table_id=table_id, consumer_id=consumer_id, next_snapshot=next_snapshot,
                    committed_at=now))

    def consumers(self, table_id: int) -> pa.Table:
        """``consumer``, ``next_snapshot``, ``committed_at`` (UTC) per consumer, by id."""
        c = t.consumers.c
        with self._read() as conn:
            rows = conn.execute(sa.select(c.consumer_id, c.next_snapshot, c.committed_at)
                                .where(c.table_id == table_id).order_by(c.consumer_id)).all()
        table = _rows_to_table(rows, pa.schema([
            ("consumer", pa.string()), ("next_snapshot", pa.int64()),
            ("committed_at", pa.int64())]))
        committed = table.column("committed_at").cast(pa.timestamp("ms", tz="UTC"))
        return table.set_column(2, pa.field("committed_at", committed.type), committed)

    def drop_consumer(self, table_id: int, consumer_id: str) -> bool:
        """Forget a consumer; whether it existed."""
        c = t.consumers.c
        with self._write() as conn:
            self._lock_table(conn, table_id)
            res = conn.execute(t.consumers.delete().where(
                (c.table_id == table_id) & (c.consumer_id == consumer_id)))
        return bool(res.rowcount)

    def expire_consumers(self, table_id: int, committed_before_ms: int) -> list[str]:
        """Drop the consumers whose last commit is older than ``committed_before_ms``."""
        c = t.consumers.c
        stale = (c.table_id == table_id) & (c.committed_at < committed_before_ms)
        with self._write() as conn:
            self._lock_table(conn, table_id)
            ids = [r[0] for r in conn.execute(sa.select(c.consumer_id).where(stale))]
            if ids:
                conn.execute(t.consumers.delete().where(stale))
        return ids

    # -- maintenance ---------------------------------------------------------------------------

    def expire_snapshots(self, table_id: int, expire: Sequence[int]) -> list[str]:
        """Delete the given snapshots and the file rows only they read; return those paths.

        Tagged snapshots are never expired. A file row is kept while a retained snapshot lies in
        ``[added_snapshot, removed_snapshot)``; live files are never touched.
        """
        if not expire:
            self._check_table(table_id)
            return []
        s, c = t.snapshots.c, t.files.c
        read_by_retained = sa.exists().where(
            (s.table_id == c.table_id) & (s.snapshot_id >= c.added_snapshot)
            & (s.snapshot_id < c.removed_snapshot))
        unread = (c.table_id == table_id) & c.removed_snapshot.is_not(None) & ~read_by_retained
        with self._write() as conn:
            self._lock_table(conn, table_id)
            tagged = sa.select(t.tags.c.snapshot_id).where(t.tags.c.table_id == table_id)
            conn.execute(t.snapshots.delete().where(
                (s.table_id == table_id) & s.snapshot_id.in_(list(expire))
                & s.snapshot_id.not_in(tagged)))
            paths = [r[0] for r in conn.execute(sa.select(c.path).where(unread))]
            conn.execute(t.files.delete().where(unread))
        return paths


class _LostRace(Exception):
    pass
