"""The metastore's database: engines and connections, read and write transactions, the
schema's creation and its migrations, and the table-row lock every write takes."""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from arrowlake.errors import (
    MetastoreError,
    ReadOnlyLake,
    TableNotFound,
)
from arrowlake.metastore import tables as t


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


class Database:
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
            if version <= 3:
                # Version 4 only adds the consumers' leases.
                t.consumer_leases.create(conn, checkfirst=True)
            if version <= 4:
                # Version 5 only adds the deletion vectors' table.
                t.vectors.create(conn, checkfirst=True)
            if version <= 5:
                # Version 6 only adds the maintenance service's leases and log.
                t.maintenance_leases.create(conn, checkfirst=True)
                t.maintenance_log.create(conn, checkfirst=True)
            if version <= 6:
                self._migrate_to_7(conn)
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
                # The rebuilt table has today's columns; later versions' columns start empty.
                old = self._column_names(conn, table.name)
                columns = ", ".join(c.name for c in table.columns if c.name in old)
                conn.exec_driver_sql(
                    f"INSERT INTO {staged} ({columns}) SELECT {columns} FROM {table.name}")
                conn.exec_driver_sql(f"DROP TABLE {table.name}")
                conn.exec_driver_sql(f"ALTER TABLE {staged} RENAME TO {table.name}")
                for index in table.indexes:
                    conn.execute(sa.schema.CreateIndex(index))
        s = t.snapshots
        self._add_missing_columns(conn, s, (s.c.write_token, s.c.superseded_at))
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

    @staticmethod
    def _column_names(conn: Connection, table_name: str) -> set[str]:
        return {c["name"] for c in sa.inspect(conn).get_columns(table_name)}

    def _add_missing_columns(self, conn: Connection, table: sa.Table,
                             columns: Sequence[sa.Column[Any]]) -> None:
        """Add ``columns`` to ``table`` where it lacks them (a table rebuilt by the version 2
        migration already has every column of today)."""
        present = self._column_names(conn, table.name)
        for column in columns:
            if column.name in present:
                continue
            kind = column.type.compile(dialect=conn.dialect)
            default = column.server_default
            tail = "" if column.nullable else \
                f" NOT NULL DEFAULT {default.arg}"  # type: ignore[union-attr]
            conn.exec_driver_sql(
                f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}{tail}")

    def _migrate_to_7(self, conn: Connection) -> None:
        """Version 7: in-flight writes, row lineage and transaction ids. Existing data files
        get row ids in commit order (by snapshot, then file id), as if lineage had always been
        kept; each snapshot's first row id is where its own files' ids start."""
        t.writes.create(conn, checkfirst=True)
        for table in t.ICEBERG_TABLES:  # the published Iceberg view (arrowlake.iceberg)
            table.create(conn, checkfirst=True)
        self._add_missing_columns(conn, t.tables, [t.tables.c.next_row_id])
        self._add_missing_columns(conn, t.files, [t.files.c.first_row_id])
        self._add_missing_columns(conn, t.snapshots, [t.snapshots.c.first_row_id,
                                                      t.snapshots.c.transaction_id])
        f, s = t.files.c, t.snapshots.c
        for table_id in conn.execute(sa.select(t.tables.c.table_id)).scalars().all():
            rows = conn.execute(sa.select(f.file_id, f.added_snapshot, f.row_count).where(
                (f.table_id == table_id) & (f.content == "data")
            ).order_by(f.added_snapshot, f.file_id)).all()
            next_id = 0
            added: dict[int, int] = {}  # snapshot -> rows of the data files it added
            updates = []
            for file_id, snapshot, count in rows:
                updates.append({"fid": int(file_id), "first": next_id})
                added[int(snapshot)] = added.get(int(snapshot), 0) + int(count)
                next_id += int(count)
            if updates:
                conn.execute(t.files.update().where(f.file_id == sa.bindparam("fid"))
                             .values(first_row_id=sa.bindparam("first")), updates)
            snapshot_ids = conn.execute(sa.select(s.snapshot_id).where(
                s.table_id == table_id)).scalars().all()
            first, running = {}, 0
            for sid in sorted({*added, *(int(x) for x in snapshot_ids)}):
                first[sid] = running
                running += added.get(sid, 0)
            if snapshot_ids:
                conn.execute(t.snapshots.update().where(
                    (s.table_id == table_id) & (s.snapshot_id == sa.bindparam("sid"))
                ).values(first_row_id=sa.bindparam("first")),
                    [{"sid": int(x), "first": first[int(x)]} for x in snapshot_ids])
            conn.execute(t.tables.update().where(t.tables.c.table_id == table_id)
                         .values(next_row_id=next_id))

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
