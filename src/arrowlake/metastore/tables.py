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

#: Bumped whenever the tables below change; ``Metastore`` brings older databases forward.
#: Version 2: table, partition and file ids are never reused (SQLite AUTOINCREMENT; PostgreSQL
#: sequences never reused them), and snapshots record their write token and when they stopped
#: being current. Version 3: streaming consumers' progress (``al_consumers``). Version 4:
#: consumers' leases (``al_consumer_leases``). Version 5: deletion vectors of primary-key
#: tables written in merge-on-write mode (``al_vectors``). Version 6: the maintenance service's
#: bucket leases (``al_maintenance_leases``) and each table's last maintenance actions
#: (``al_maintenance_log``). Version 7: writes in flight (``al_writes``), so that orphan removal
#: never deletes the files of a write that has not committed yet; row lineage
#: (``al_tables.next_row_id``, ``al_files.first_row_id``, ``al_snapshots.first_row_id``), the
#: row ids Iceberg v3 readers see; the lake transaction a snapshot was committed in
#: (``al_snapshots.transaction_id``); the published Iceberg view (``al_iceberg_*``: see
#: :mod:`arrowlake.metastore.iceberg`).
SCHEMA_VERSION = 7

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
    # Row lineage: the first row id the next committed data file gets (its rows take the ids
    # from there on, in file order).
    Column("next_row_id", BigInteger, nullable=False, default=0, server_default="0"),
    UniqueConstraint("namespace", "name", name="al_tables_name"),
    # A handle to a dropped table must never find a new table under its id, and a planned
    # removal of file ids never an unrelated new file: ids are never handed out twice.
    sqlite_autoincrement=True,
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
    # Random per write (not the user's commit_id): a retry after a lost reply to COMMIT finds
    # the snapshot its own earlier attempt recorded.
    Column("write_token", String(64), nullable=True),
    # When the next snapshot replaced this one as current (epoch ms); null while current.
    # Kept after the next snapshot expires, so time travel knows this one had been replaced.
    Column("superseded_at", BigInteger, nullable=True),
    # Row lineage: the row id of the first row of the data files this snapshot added.
    Column("first_row_id", BigInteger, nullable=True),
    # The lake transaction that committed this snapshot together with other tables' (null for
    # a write committed alone).
    Column("transaction_id", String(64), nullable=True),
    PrimaryKeyConstraint("table_id", "snapshot_id"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
    Index("al_snapshots_commit", "table_id", "commit_id"),
    Index("al_snapshots_token", "table_id", "write_token"),
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
    sqlite_autoincrement=True,
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
    # Row lineage (data files): the id of the file's first row; row i has first_row_id + i.
    # Assigned once, by the commit that adds the file, so every publication agrees on it.
    Column("first_row_id", BigInteger, nullable=True),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
    Index("al_files_added", "table_id", "added_snapshot"),
    Index("al_files_removed", "table_id", "removed_snapshot"),
    sqlite_autoincrement=True,
)

#: The tables whose SQLite version-1 form lacks AUTOINCREMENT, parents first.
AUTOINCREMENT_TABLES = (tables, partitions, files)

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

consumers = Table(
    "al_consumers",
    metadata,
    Column("table_id", Integer, nullable=False),
    Column("consumer_id", String(255), nullable=False),
    # The first snapshot the consumer has not processed yet: a restarted stream resumes there.
    Column("next_snapshot", BigInteger, nullable=False),
    Column("committed_at", BigInteger, nullable=False),  # epoch ms of the last progress commit
    PrimaryKeyConstraint("table_id", "consumer_id"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

consumer_leases = Table(
    "al_consumer_leases",
    metadata,
    Column("table_id", Integer, nullable=False),
    Column("consumer_id", String(255), nullable=False),
    # The open stream that holds the consumer id: a random token, and where it runs (the
    # process id within ``host``, which names the machine and PID namespace).
    Column("holder", String(64), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("expires_at", BigInteger, nullable=False),  # epoch ms; the holder renews it
    PrimaryKeyConstraint("table_id", "consumer_id"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

vectors = Table(
    "al_vectors",
    metadata,
    # One cumulative deletion vector of one data file, as of the snapshots in
    # [added_snapshot, removed_snapshot): a commit that deletes more rows of the file closes
    # the file's current row and adds the union. The file's live rows are its row_count minus
    # this cardinality.
    Column("table_id", Integer, nullable=False),
    Column("file_id", BigInteger, nullable=False),
    Column("added_snapshot", BigInteger, nullable=False),
    Column("removed_snapshot", BigInteger, nullable=True),
    Column("cardinality", BigInteger, nullable=False),
    # The vector's deletion-vector-v1 bytes, when small enough to keep here ...
    Column("blob", LargeBinary, nullable=True),
    # ... else where they are: a Puffin file (path relative to the table location) and range.
    Column("puffin_path", Text, nullable=True),
    Column("blob_offset", BigInteger, nullable=True),
    Column("blob_length", BigInteger, nullable=True),
    PrimaryKeyConstraint("table_id", "file_id", "added_snapshot"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
    Index("al_vectors_added", "table_id", "added_snapshot"),
    Index("al_vectors_removed", "table_id", "removed_snapshot"),
)

maintenance_leases = Table(
    "al_maintenance_leases",
    metadata,
    # A maintenance service's hold on one bucket of a table (every partition's files of that
    # bucket number) while it compacts it: two services never compact the same bucket.
    Column("table_id", Integer, nullable=False),
    Column("bucket", Integer, nullable=False),
    Column("holder", String(64), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("expires_at", BigInteger, nullable=False),  # epoch ms; the holder renews it
    PrimaryKeyConstraint("table_id", "bucket"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

maintenance_log = Table(
    "al_maintenance_log",
    metadata,
    # The last maintenance action of each kind (compact, expire, orphans) on a table.
    Column("table_id", Integer, nullable=False),
    Column("action", String(32), nullable=False),
    Column("at", BigInteger, nullable=False),  # epoch ms, when it finished
    Column("detail", Text, nullable=False, default="{}"),  # JSON: what it did
    PrimaryKeyConstraint("table_id", "action"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

writes = Table(
    "al_writes",
    metadata,
    # A write in flight: registered before it writes its first file, ended when it commits or
    # aborts. Every file it puts under the table's location starts with its ``write_id``, so
    # orphan removal skips them while the row exists; orphan removal deletes the row of a write
    # whose holder is gone (or whose lease ran out) before it deletes any of its files, and a
    # commit checks the row inside its transaction, so a write whose files may be gone never
    # commits. A detached write (pid 0: a Spark data source write, whose Python processes on
    # the driver come and go) has no holder to check: only its lease, extended by each of its
    # commits, decides.
    Column("write_id", String(32), primary_key=True),
    # The table written (null: several, in one lake transaction). Orphan removal of any table
    # honours every registration: the id in a file's name is what counts.
    Column("table_id", Integer, nullable=True),
    Column("kind", String(32), nullable=False),  # append, upsert, spark, dask, flight, ...
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", BigInteger, nullable=False),  # epoch ms
    Column("expires_at", BigInteger, nullable=False),  # epoch ms; renewals extend it ...
    Column("lease_ms", BigInteger, nullable=False),  # ... by this much
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
    Index("al_writes_table", "table_id"),
)


# -- the published Iceberg view (arrowlake.iceberg; queries in arrowlake.metastore.iceberg) -------
# Iceberg metadata is derived from the tables above and written by publishers (on demand, or by
# the maintenance service). These rows record what was written, so that a later publication
# reuses it (cost proportional to what a snapshot changed), orphan removal and purges know the
# files, and expiry deletes those only expired snapshots used. Paths are relative to the table's
# location, like data files'.

iceberg_tables = Table(
    "al_iceberg_tables",
    metadata,
    # A table's current Iceberg metadata: what a reader (the REST catalog) is given. Changed
    # only by a compare-and-swap on ``version``, so concurrent publishers never leave two
    # diverging "current" metadata files.
    Column("table_id", Integer, primary_key=True, autoincrement=False),
    Column("metadata_path", Text, nullable=True),  # null: nothing current (its file expired)
    Column("snapshot_id", BigInteger, nullable=True),  # the snapshot it describes as current
    Column("version", BigInteger, nullable=False, default=0),
    Column("published_at", BigInteger, nullable=False),  # epoch ms
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

iceberg_metadata = Table(
    "al_iceberg_metadata",
    metadata,
    # One metadata JSON file written: the table as of ``snapshot_id`` (null: no snapshot yet),
    # identified by the hash of its content, so an unchanged view is never written twice.
    Column("table_id", Integer, nullable=False),
    Column("path", Text, nullable=False),
    Column("snapshot_id", BigInteger, nullable=True),
    # Every snapshot it lists (JSON): once one of them expires, its manifest list is deleted,
    # and so is this file, which refers to it.
    Column("snapshot_ids", Text, nullable=False, default="[]"),
    Column("content_hash", String(64), nullable=False),
    Column("published_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("table_id", "path"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
    Index("al_iceberg_metadata_hash", "table_id", "content_hash"),
    Index("al_iceberg_metadata_snapshot", "table_id", "snapshot_id"),
)

iceberg_snapshots = Table(
    "al_iceberg_snapshots",
    metadata,
    # A snapshot published as an Iceberg snapshot: its manifest list. Published snapshots are
    # always every retained snapshot with a view up to the newest one published.
    Column("table_id", Integer, nullable=False),
    Column("snapshot_id", BigInteger, nullable=False),
    Column("manifest_list", Text, nullable=False),
    Column("published_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("table_id", "snapshot_id"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

iceberg_manifests = Table(
    "al_iceberg_manifests",
    metadata,
    # One manifest (content 0: data files, 1: deletion vectors), used by the published
    # snapshots in [added_snapshot, removed_snapshot), as data files are by theirs: a manifest
    # that loses an entry is rewritten, and small ones are merged, in the snapshot that does it.
    Column("table_id", Integer, nullable=False),
    Column("path", Text, nullable=False),
    Column("content", Integer, nullable=False),
    Column("added_snapshot", BigInteger, nullable=False),
    Column("removed_snapshot", BigInteger, nullable=True),
    Column("length", BigInteger, nullable=False),
    # The partition spec it was written with (a hash): a changed spec rewrites every manifest.
    Column("spec_key", String(64), nullable=False),
    Column("min_sequence", BigInteger, nullable=False),
    Column("added_files", Integer, nullable=False),
    Column("existing_files", Integer, nullable=False),
    Column("deleted_files", Integer, nullable=False),
    Column("added_rows", BigInteger, nullable=False),
    Column("existing_rows", BigInteger, nullable=False),
    Column("deleted_rows", BigInteger, nullable=False),
    Column("first_row_id", BigInteger, nullable=True),
    Column("partitions", Text, nullable=False, default="[]"),  # JSON: the partition summaries
    # The data files (al_files ids) whose entries it holds live, ascending, as little-endian
    # int64; and their range, so a removal looks only into manifests that may hold it.
    Column("min_file_id", BigInteger, nullable=True),
    Column("max_file_id", BigInteger, nullable=True),
    Column("file_ids", LargeBinary, nullable=False),
    PrimaryKeyConstraint("table_id", "path"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
    Index("al_iceberg_manifests_removed", "table_id", "removed_snapshot"),
)

iceberg_vectors = Table(
    "al_iceberg_vectors",
    metadata,
    # Where a deletion vector (the al_vectors row of the same key) is published: a Puffin file
    # holding it alone, either arrowlake's own (``copied`` 0) or a copy the publisher wrote
    # (``copied`` 1, deleted once the vector's row is).
    Column("table_id", Integer, nullable=False),
    Column("file_id", BigInteger, nullable=False),
    Column("added_snapshot", BigInteger, nullable=False),
    Column("path", Text, nullable=False),
    Column("blob_offset", BigInteger, nullable=False),
    Column("blob_length", BigInteger, nullable=False),
    Column("file_size", BigInteger, nullable=False),
    Column("copied", Integer, nullable=False),
    PrimaryKeyConstraint("table_id", "file_id", "added_snapshot"),
    ForeignKeyConstraint(["table_id"], ["al_tables.table_id"], ondelete="CASCADE"),
)

#: The tables above, created by the version 7 migration.
ICEBERG_TABLES = (iceberg_tables, iceberg_metadata, iceberg_snapshots, iceberg_manifests,
                  iceberg_vectors)
