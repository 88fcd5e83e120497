"""The metastore's SQL tables (SQLAlchemy Core), shared by SQLite and PostgreSQL.

A table's state is rows here; data files are immutable. The files of snapshot S are the rows
of ``al_files`` with ``added_snapshot <= S`` and (``removed_snapshot`` null or ``> S``), so time
travel and the changes between two snapshots are each one range query.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

#: Bumped whenever the tables below change; ``migrate`` brings older databases forward.
SCHEMA_VERSION = 1

metadata = MetaData()

meta_info = Table(
    "al_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

namespaces = Table(
    "al_namespaces",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("properties", Text, nullable=False, default="{}"),
    Column("created_at", BigInteger, nullable=False),
)

tables = Table(
    "al_tables",
    metadata,
    Column("table_id", Integer, primary_key=True, autoincrement=True),
    Column("namespace", String(255), nullable=False),
    Column("name", String(255), nullable=False),
    Column("location", Text, nullable=False),
    Column("current_schema_id", Integer, nullable=False),
    Column("current_snapshot_id", BigInteger, nullable=True),
    # Highest snapshot id ever used: ids stay unique after a rollback or expiry.
    Column("last_snapshot_id", BigInteger, nullable=False, default=0),
    Column("last_field_id", Integer, nullable=False),
    Column("partition_by", Text, nullable=False, default="[]"),
    Column("primary_key", Text, nullable=False, default="[]"),
    Column("buckets", Integer, nullable=True),
    Column("properties", Text, nullable=False, default="{}"),
    Column("created_at", BigInteger, nullable=False),
    UniqueConstraint("namespace", "name", name="al_tables_name"),
)

schemas = Table(
    "al_schemas",
    metadata,
    Column("table_id", Integer, nullable=False),
    Column("schema_id", Integer, nullable=False),
    Column("arrow_schema", LargeBinary, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("table_id", "schema_id"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

snapshots = Table(
    "al_snapshots",
    metadata,
    Column("table_id", Integer, nullable=False),
    Column("snapshot_id", BigInteger, nullable=False),
    Column("parent_id", BigInteger, nullable=True),
    Column("kind", String(32), nullable=False),
    Column("committed_at", BigInteger, nullable=False),  # epoch milliseconds, UTC
    Column("schema_id", Integer, nullable=False),
    Column("commit_id", String(255), nullable=True),
    Column("added_files", BigInteger, nullable=False),
    Column("removed_files", BigInteger, nullable=False),
    Column("added_rows", BigInteger, nullable=False),
    Column("removed_rows", BigInteger, nullable=False),
    Column("total_files", BigInteger, nullable=False),
    Column("total_rows", BigInteger, nullable=False),
    Column("summary", Text, nullable=False, default="{}"),
    PrimaryKeyConstraint("table_id", "snapshot_id"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
    Index("al_snapshots_commit", "table_id", "commit_id"),
)

partitions = Table(
    "al_partitions",
    metadata,
    Column("partition_id", Integer, primary_key=True, autoincrement=True),
    Column("table_id", Integer, nullable=False),
    Column("path", Text, nullable=False),  # Hive-style: day=2026-11-01/region=eu
    Column("partition_values", Text, nullable=False),  # JSON list, encoded per column type
    UniqueConstraint("table_id", "path", name="al_partitions_path"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

files = Table(
    "al_files",
    metadata,
    Column("file_id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("table_id", Integer, nullable=False),
    Column("path", Text, nullable=False),  # relative to the table location
    Column("partition_id", Integer, nullable=True),
    Column("bucket", Integer, nullable=True),
    Column("added_snapshot", BigInteger, nullable=False),
    Column("removed_snapshot", BigInteger, nullable=True),
    Column("schema_id", Integer, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column("file_size", BigInteger, nullable=False),
    Column("content", String(16), nullable=False, default="data"),
    Column("stats", Text, nullable=False, default="{}"),  # JSON: field id -> [min, max, nulls]
    Column("key_min", Text, nullable=True),  # primary-key tables: JSON-encoded key range
    Column("key_max", Text, nullable=True),
    Column("seq_min", BigInteger, nullable=True),
    Column("seq_max", BigInteger, nullable=True),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
    Index("al_files_added", "table_id", "added_snapshot"),
    Index("al_files_removed", "table_id", "removed_snapshot"),
)

tags = Table(
    "al_tags",
    metadata,
    Column("table_id", Integer, nullable=False),
    Column("name", String(255), nullable=False),
    Column("snapshot_id", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("table_id", "name"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)
