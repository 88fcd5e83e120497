"""arrowlake as a Spark Structured Streaming source and sink (``pyspark.sql.datasource``).

    (spark.readStream.format("arrowlake").option("lake", "./lake")
          .option("includeRowKind", "true").load("shop.orders")
          .writeStream.format("arrowlake").option("lake", "./lake")
          .option("checkpointLocation", "/tmp/ck").start("shop.copy"))

Reading: an offset is ``{"snapshot": s}``: everything up to snapshot ``s`` has been read
(``s == -1``: nothing yet, and the first batch is the full table). A batch over ``(s, e]``
reads the table's changes snapshot by snapshot (one change per snapshot, in order, planned by
:mod:`arrowlake.streaming`: never the net "catch-up" change), one input partition per split,
partitions in snapshot order; the first batch of ``startingSnapshot=full`` (the default) is
the whole table as of ``e``, as ``+I`` rows. Options:

- ``startingSnapshot``: ``full`` (default) | ``latest`` (only what is committed after the
  query starts) | ``earliest`` (every retained snapshot's change) | a snapshot id (its change
  and the later ones). A checkpoint, then a consumer's committed progress, take precedence.
- ``maxSnapshotsPerTrigger``, ``maxRowsPerTrigger``: admission control; a batch takes at
  least one snapshot, and the row limit counts the rows of the changes' files (an upper
  bound). ``trigger(availableNow=True)`` reads up to the snapshot current when the query
  starts, in batches of these sizes.
- ``consumer``: when Spark commits a batch the consumer's progress is committed in the
  metastore too (``table.consumers()``), so ``expire_snapshots`` keeps what the query still
  needs; a query started without a checkpoint resumes from it.
- ``includeRowKind`` (``true``/``false``, default ``false``) adds the string column
  ``_row_kind`` (``+I -U +U -D``). PySpark infers one schema for a source, used by batch and
  streaming reads alike and without telling the source which one it is, so the column is an
  option rather than the default of streams; a schema given with ``.schema(...)`` that
  contains ``_row_kind`` has the same effect.
- ``columns`` (comma-separated) and ``filter`` (an arrowlake filter) as for batch reads: only
  those columns are read, and the filter prunes the files of each change and drops the rows
  it does not match, as ``Table.stream(filter=...)`` does.

Writing: each micro-batch is staged by the tasks (:func:`arrowlake.table.staged.stage`) and
committed once on the driver with the commit id ``spark-stream:<query id>:<batch id>``; the
query id is Spark's persistent one (it survives restarts from the checkpoint), so a batch
Spark replays after a crash is recognized and skipped. Output modes: ``append`` appends (an
upsert on a primary-key table); ``complete`` overwrites the table each batch. ``update``:
Spark (4.1-4.3) refuses update mode for every Python sink ("does not support Update mode":
its Python write builder lacks ``SupportsStreamingUpdateAsAppend``), so an update-mode query
writes through :func:`foreach_batch_sink`, which upserts each batch into a primary-key
table, once, with the same commit ids. Input with a ``_row_kind`` column (from an
arrowlake stream) into a primary-key table is applied as changes (``-D`` deletes, ``-U`` is
ignored as the ``+U`` after it replaces the row); the ``write`` option chooses explicitly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StringType, StructField, StructType

from arrowlake.errors import ArrowlakeError, ValidationError
from arrowlake.lazy import lazy_module
from arrowlake.scan.split import Split
from arrowlake.spark.pipelines import pipeline_options
from arrowlake.spark.session import is_connect
from arrowlake.spark.source import (
    FORMAT,
    ReadOptions,
    StagedMessage,
    open_table,
    plan_splits,
    source_schema,
    user_facing,
    write_lease,
    write_mode,
)
from arrowlake.spark.source import ArrowlakeDataSource as BatchDataSource
from arrowlake.spark.types import (
    from_spark_batch,
    spark_arrow_schema,
    spark_schema,
    to_spark_batch,
)
from arrowlake.streaming.splits import ROW_KIND_COLUMN, ChangeSplit

try:  # PySpark 4.2+: admission control and Trigger.AvailableNow for Python stream readers
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxFiles,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
except ImportError:  # PySpark 4.1: latestOffset() takes no start and no limit
    ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-ins for the read limits of PySpark 4.2+ (4.1 never hands one over)."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class ReadMaxFiles(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_files: int) -> None:
            self.max_files = max_files

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

if TYPE_CHECKING:
    from arrowlake.streaming import stream as streams
    from arrowlake.streaming.change import AnySplit
    from arrowlake.table import staged as staging
    from arrowlake.table.staged import StagedWrite, WriteMode, WriteTarget
    from arrowlake.table.table import Table
else:
    # What only the driver runs (planning changes, committing), imported on first use: an
    # executor's Python worker imports this module to read a split and never needs them.
    streams = lazy_module("arrowlake.streaming.stream")
    staging = lazy_module("arrowlake.table.staged")

#: The offset before the first batch of a ``full`` start: the first batch reads the table.
BEFORE_FULL = -1
#: Spark's local property with the persistent id of a streaming query.
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _flag(options: Mapping[str, str], key: str) -> bool:
    value = str(options.get(key) or "false").strip().lower()
    if value not in ("true", "false"):
        raise ValidationError(f"Option {key!r} must be true or false, got {value!r}")
    return value == "true"


def _positive(options: Mapping[str, str], key: str) -> int | None:
    text = options.get(key)
    if text in (None, ""):
        return None
    try:
        value = int(str(text))
    except ValueError:
        value = 0
    if value <= 0:
        raise ValidationError(f"Option {key!r} must be a positive integer, got {text!r}")
    return value


def stream_schema(options: Mapping[str, str], table_schema: pa.Schema | None = None
                  ) -> StructType:
    """The schema of a read: the table's columns (``columns``, or ``table_schema`` when the
    caller has it), and ``_row_kind`` when ``includeRowKind`` is true."""
    schema = spark_schema(table_schema if table_schema is not None else source_schema(options))
    if _flag(options, "includerowkind"):
        schema = StructType([*schema.fields, StructField(ROW_KIND_COLUMN, StringType(), False)])
    return schema


# -- reading ------------------------------------------------------------------------------------


class ChangePartition(InputPartition):
    """One input partition: one split of one snapshot's change."""

    def __init__(self, split: ChangeSplit | None) -> None:
        super().__init__(None)
        self.split = split


class ArrowlakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver from the table's snapshots; executors read splits."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = dict(options)
        names = schema.fieldNames()
        self.include_row_kind = ROW_KIND_COLUMN in names
        self.columns = tuple(n for n in names if n != ROW_KIND_COLUMN)
        self.target = spark_arrow_schema(schema)
        self.consumer = self.options.get("consumer") or None
        self.max_snapshots = _positive(self.options, "maxsnapshotspertrigger")
        self.max_rows = _positive(self.options, "maxrowspertrigger")
        if not ADMISSION_CONTROL and (self.max_snapshots or self.max_rows):
            raise ValidationError(
                "Options maxSnapshotsPerTrigger and maxRowsPerTrigger need PySpark 4.2 or "
                f"later: PySpark {_pyspark_version()} gives Python stream readers no read "
                "limits (pyspark.sql.streaming.datasource is missing). Drop the option (each "
                "batch then reads every snapshot committed since the last one) or upgrade")
        if not ADMISSION_CONTROL and self.consumer is not None:
            raise ValidationError(
                f"Option consumer needs PySpark 4.2 or later: PySpark {_pyspark_version()} "
                "tells a Python stream reader neither where a batch starts nor when the last "
                "batch of an availableNow run is done, so the consumer's progress would lag "
                "and a query resuming from it would read a batch twice. Drop the option (the "
                "checkpoint keeps the query's place; table.stream(consumer=...) keeps a "
                "consumer's) or upgrade")
        # Where the query stands, for PySpark 4.1, whose latestOffset() is not told
        # (None: not known yet, e.g. right after a restart from a checkpoint).
        self._position: int | None = None
        self.available_now: int | None = None  # the last snapshot of an availableNow run
        start = str(self.options.get("startingsnapshot") or "full").strip().lower()
        if start not in ("full", "latest", "earliest") and not start.isdigit():
            raise ValidationError(
                f"Option startingSnapshot must be full, latest, earliest or a snapshot id, "
                f"got {start!r}")
        self.start = start
        # As for batch reads: the filter prunes the files of each change and drops the rows it
        # does not match (the source takes no filter pushed by Spark, see source.py).
        self.filter = ReadOptions.from_options(self.options).filter
        self._table: Table | None = open_table(self.options)

    @property
    def table(self) -> Table:
        """The table, opened on the driver (the reader is pickled for executors without it)."""
        if self._table is None:
            self._table = open_table(self.options)
        return self._table

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_table": None}

    def _current(self) -> int:
        table = self.table
        current = table._metastore.current_snapshot_id(table._record.table_id)
        return 0 if current is None else int(current)

    def _stream(self, after: int) -> streams.Stream:
        """A stream of the changes after snapshot ``after`` (one change per snapshot)."""
        return streams.Stream(self.table, start=after + 1,
                              include_row_kind=self.include_row_kind, filter=self.filter,
                              columns=self.columns, catch_up_threshold=None, prefetch=False)

    # -- offsets ---------------------------------------------------------------------------

    @user_facing
    def initialOffset(self) -> dict:
        ms, tid = self.table._metastore, self.table._record.table_id
        resume = (ms.consumer_next_snapshot(tid, self.consumer)
                  if self.consumer is not None else None)
        position: int
        if resume is not None:
            position = int(resume) - 1
        elif self.start == "full":
            position = BEFORE_FULL
        elif self.start == "latest":
            position = self._current()
        elif self.start == "earliest":
            earliest = ms.earliest_snapshot_id(tid)
            if earliest is None:
                position = 0
            elif ms.snapshot(tid, earliest)["parent_id"] is None:
                position = earliest - 1
            else:
                position = BEFORE_FULL  # older changes expired: start from the state
        else:
            snapshot = int(self.start)
            ms.snapshot(tid, snapshot)  # SnapshotNotFound when expired or never committed
            position = snapshot - 1
        if self.consumer is not None and resume is None and position != BEFORE_FULL:
            # Registered now, so expiry keeps the changes the query is about to read.
            ms.commit_consumer(tid, self.consumer, position + 1)
        self._position = position
        return {"snapshot": position}

    def getDefaultReadLimit(self) -> ReadLimit:
        # Spark hands this back to latestOffset (ReadAllAvailable when a trigger means "all").
        # A snapshot limit travels as ReadMaxFiles: a snapshot is this source's unit.
        if self.max_rows is not None:
            return ReadMaxRows(self.max_rows)
        if self.max_snapshots is not None:
            return ReadMaxFiles(self.max_snapshots)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = self._current()

    @user_facing
    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        if start is None:
            # PySpark 4.1 calls latestOffset() with no start and no limit: every snapshot
            # committed so far (the options that limit batches are refused there).
            latest = self._current()
            if latest <= 0:  # nothing committed yet: stay where the query is
                return {"snapshot": self._position if self._position is not None else 0}
            self._position = latest
            return {"snapshot": latest}
        position = int(start["snapshot"])
        # Spark asks for the next batch once every batch up to ``start`` is committed (after a
        # restart it first re-runs a planned batch without asking): ``commit`` comes one batch
        # later, and never for the last batch of an availableNow run.
        self.commit(start)
        latest = self._current()
        if self.available_now is not None:
            latest = min(latest, self.available_now)
        if position == BEFORE_FULL:
            # The first batch: the whole table at the latest snapshot (one unit of work).
            return {"snapshot": latest} if latest > 0 else start
        if latest <= position:
            return start
        if isinstance(limit, ReadAllAvailable):
            return {"snapshot": latest}
        max_snapshots = limit.max_files if isinstance(limit, ReadMaxFiles) \
            else self.max_snapshots
        end = latest if max_snapshots is None else min(latest, position + max_snapshots)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
        if max_rows is not None:
            end = self._row_limited_end(position, end, max_rows)
        return {"snapshot": end}

    def _row_limited_end(self, position: int, end: int, max_rows: int) -> int:
        """The last snapshot in ``(position, end]`` whose changes, with those before it, stay
        within ``max_rows`` (at least the first snapshot)."""
        stream = self._stream(position)
        try:
            rows = 0
            while stream.position < end:
                change = stream.poll()
                if change is None or change.snapshot_id > end:
                    return end  # the snapshots left change no rows
                if rows and rows + change.row_count > max_rows:
                    return change.snapshot_id - 1
                rows += change.row_count
            return end
        finally:
            stream.close()

    def reportLatestOffset(self) -> dict | None:
        return {"snapshot": self._current()}

    # -- planning and reading --------------------------------------------------------------

    @user_facing
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, last = int(start["snapshot"]), int(end["snapshot"])
        if last <= first or last <= 0:
            return []
        splits: list[AnySplit] = []
        if first == BEFORE_FULL:
            scan = self.table.scan(self.filter, list(self.columns), snapshot=last)
            full: list[Split] = plan_splits(scan)
            splits += [ChangeSplit(s, "+I", self.include_row_kind, self.columns) for s in full]
        else:
            stream = self._stream(first)
            try:
                while stream.position < last:
                    change = stream.poll()
                    if change is None or change.snapshot_id > last:
                        break
                    splits += change.splits
            finally:
                stream.close()
        return [ChangePartition(s) for s in splits]  # type: ignore[arg-type]

    @user_facing
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChangePartition)
        if partition.split is None:
            return
        for batch in partition.split.to_batches():
            yield to_spark_batch(batch, self.target)

    @user_facing
    def commit(self, end: dict) -> None:
        """Spark has processed everything up to ``end``: the consumer's progress."""
        snapshot = int(end["snapshot"])
        if self._position is None:
            self._position = snapshot
        if self.consumer is not None and snapshot > 0:
            self.table._metastore.commit_consumer(self.table._record.table_id, self.consumer,
                                                  snapshot + 1)


class _RefusedStreamReader(DataSourceStreamReader):
    """A stream reader that could not be made: every call raises why (see streamReader)."""

    def __init__(self, error: ArrowlakeError) -> None:
        self.error = error

    @user_facing
    def initialOffset(self) -> dict:
        raise self.error

    @user_facing
    def latestOffset(self) -> dict:  # type: ignore[override]
        raise self.error

    @user_facing
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error


# -- writing ------------------------------------------------------------------------------------


@dataclass
class StreamMessage(WriterCommitMessage):
    staged: StagedWrite
    query_id: str | None


def stream_write_mode(options: Mapping[str, str], overwrite: bool, table: Table,
                      schema: StructType) -> tuple[WriteMode, str]:
    """The write mode of a streaming sink, and the row-kind column for ``changes``."""
    explicit = options.get("write")
    names = schema.fieldNames()
    if (not explicit and not overwrite and table._record.primary_key
            and ROW_KIND_COLUMN in names and ROW_KIND_COLUMN not in table.schema.names):
        return "changes", ROW_KIND_COLUMN
    return write_mode(options, overwrite), str(options.get("rowkind") or "op")


def stream_query_key(options: Mapping[str, str]) -> str | None:
    """A stable id of the query from its checkpoint location (when the writer runs without
    Spark's query id)."""
    where = options.get("checkpointlocation")
    if not where:
        return None
    return "ck-" + hashlib.sha256(str(where).encode()).hexdigest()[:16]


class ArrowlakeStreamWriter(DataSourceStreamArrowWriter):
    """Tasks stage files; the driver commits each micro-batch once, idempotently."""

    def __init__(self, options: Mapping[str, str], overwrite: bool, schema: StructType
                 ) -> None:
        # A declarative pipeline's flow names no table: its checkpoint location does.
        self.options, self.flow = pipeline_options(options, schema)
        table = open_table(self.options)
        self.mode, self.row_kind = stream_write_mode(self.options, overwrite, table, schema)
        staging.check_mode(table.state, self.mode, None)
        # Detached (see ArrowlakeDataSourceWriter): kept by its lease, which every micro-batch's
        # commit extends; a query idle for longer than the lease fails its next commit.
        self.target: WriteTarget = staging.write_target(
            table.state, "spark-stream", detached_lease=write_lease(self.options))

    @user_facing
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        order = context.partitionId() if context is not None else 0
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        schema = self.target.schema
        if self.mode == "changes":
            schema = schema.append(pa.field(self.row_kind, pa.string()))
        batches = [from_spark_batch(b, schema) for b in iterator]
        if not batches or not any(b.num_rows for b in batches):
            return StreamMessage(staging.StagedWrite((), 0, order), query_id)
        reader = pa.RecordBatchReader.from_batches(batches[0].schema, iter(batches))
        return StreamMessage(staging.stage(self.target, reader, self.mode,
                                           row_kind=self.row_kind, order=order), query_id)

    def _commit_id(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> str:
        ids = {m.query_id for m in messages if isinstance(m, StreamMessage) and m.query_id}
        query = (self.options.get("queryid") or (ids.pop() if len(ids) == 1 else None)
                 or stream_query_key(self.options))
        if query is None:
            raise ValidationError(
                "The arrowlake sink cannot tell which streaming query commits: set "
                "option('checkpointLocation', ...) or option('queryId', ...)")
        return f"spark-stream:{query}:{batch_id}"

    @user_facing
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = [m.staged for m in messages if isinstance(m, StagedMessage | StreamMessage)]
        mode = self.mode
        if batchId == 0 and self.flow is not None and self.flow.is_default_flow:
            mode = "overwrite"  # a pipeline dataset's first batch: a new table, or a full refresh
        staging.commit_staged(open_table(self.options).state, staged, mode,
                              commit_id=self._commit_id(messages, batchId))

    @user_facing
    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staging.discard_staged(self.target, [m.staged for m in messages
                                             if isinstance(m, StagedMessage | StreamMessage)])


def batch_query_id(batch_df: Any, given: str | None, what: str) -> str:
    """The streaming query a ``foreachBatch`` function's batch belongs to: ``given`` (the
    function's ``queryId``), else the id Spark records for the query's batches. Under Spark
    Connect the function runs in a session of the server's that cannot see it."""
    if given:
        return given
    if is_connect(batch_df.sparkSession):
        raise ValidationError(
            f"{what} under Spark Connect cannot see the streaming query's id: pass "
            "queryId=... (a name unique to the query that it keeps when it restarts from its "
            f"checkpoint), e.g. {what}(..., queryId='daily')")
    query = batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if not query:
        raise ValidationError(
            f"{what} runs inside a streaming query's foreachBatch; outside one, pass "
            "queryId=... to name the writer")
    return str(query)


def foreach_batch_sink(lake: str | None, table: str, **options: str
                       ) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to ``table`` in one commit with
    the commit id ``spark-stream:<query id>:<batch id>`` (a replayed batch is skipped).

    ``append`` on a primary-key table upserts, so this is update mode's sink::

        agg.writeStream.outputMode("update").foreachBatch(
            foreach_batch_sink("./lake", "shop.daily_totals")).option(
            "checkpointLocation", "/tmp/ck").start()

    ``options`` are batch write options (``write``, ``rowKind``, storage options, ...).
    Under Spark Connect the function runs in a Connect session of the server's, which cannot
    see the query's id: pass ``queryId=...``, a name of the query's own that stays the same
    when it restarts from its checkpoint.
    """

    def write_batch(batch_df: Any, batch_id: int) -> None:
        query = batch_query_id(batch_df, options.get("queryId"), "foreach_batch_sink")
        writer = batch_df.write.format(FORMAT).mode("append")
        if lake is not None:  # None: the default lake of the environment ($ARROWLAKE_LAKE)
            writer = writer.option("lake", lake)
        for key, value in options.items():
            if key != "queryId":
                writer = writer.option(key, value)
        writer.option("commitId", f"spark-stream:{query}:{batch_id}").save(table)

    return write_batch


# -- the source ---------------------------------------------------------------------------------


class ArrowlakeDataSource(BatchDataSource):
    """``format("arrowlake")``: batch and streaming reads and writes of arrowlake tables."""

    @user_facing
    def schema(self) -> StructType:
        return stream_schema(self.options, self.table_schema())

    @user_facing
    def reader(self, schema: StructType) -> DataSourceReader:
        if ROW_KIND_COLUMN in schema.fieldNames():
            raise ValidationError(
                "Option includeRowKind (a _row_kind column) is for streaming reads "
                "(spark.readStream); a batch read has no row kinds")
        return super().reader(schema)

    @user_facing
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            return ArrowlakeStreamReader(self.options, schema)
        except ArrowlakeError as error:
            if ADMISSION_CONTROL:
                raise
            # PySpark 4.1's runner answers an error raised here with an UnboundLocalError of
            # its own (its `finally` stops a reader it never got), hiding ours: the reader it
            # gets raises ours on the first call instead.
            return _RefusedStreamReader(error)

    @user_facing
    def streamWriter(self, schema: StructType, overwrite: bool) -> ArrowlakeStreamWriter:
        return ArrowlakeStreamWriter(self.options, overwrite, schema)
