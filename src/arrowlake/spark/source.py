"""arrowlake as a PySpark data source (batch read and write), on ``pyspark.sql.datasource``.

    spark.read.format("arrowlake").option("lake", "./lake").load("shop.orders")
    df.write.format("arrowlake").option("lake", "./lake").mode("append").save("crm.users")

Options (case-insensitive):

- ``lake``: what :func:`arrowlake.connect` takes (a path, or a database URL); without it the
  environment's default lake (``$ARROWLAKE_LAKE``, ``$ARROWLAKE_WAREHOUSE``,
  ``$ARROWLAKE_STORAGE_OPTIONS``: :func:`arrowlake.lake.lake_address`); ``warehouse`` for a
  database URL; storage options as ``storage.<key>`` (``storage.endpoint``, ...) or all at once
  as JSON in ``storageOptions``. Executors open nothing but storage: splits and write targets
  carry what they need.
- reading: ``snapshot`` (id), ``asOf`` (ISO date-time, or epoch milliseconds), ``tag``,
  ``filter`` (an arrowlake filter, ``"day = '2026-11-01' and id < 10"``: prunes partitions,
  buckets and files, and drops the rows it does not match), ``columns`` (comma-separated:
  PySpark gives Python sources no column pruning, so this is how to read only some columns; a
  schema given with ``.schema(...)`` does the same), ``splitSize`` (bytes per input partition;
  the table's ``read.split-size`` by default), ``minPartitions`` (without ``splitSize``,
  splits are made smaller to give at least this many input partitions; the driver's CPU count
  by default).
- writing: ``write`` = ``append`` (an upsert on primary-key tables) | ``upsert`` | ``changes``
  (with ``rowKind``, the column holding ``+I -U +U -D``; ``op`` by default); with
  ``mode("overwrite")``, ``replaceWhere`` replaces only the matching rows; ``commitId`` makes the
  commit idempotent.

The lake must exist: a path with no ``arrowlake.db`` (or a SQLite URL naming no file) is
refused with :class:`~arrowlake.errors.NotFound`, creating nothing (a typo would otherwise leave
a new lake behind on the driver and on every executor).

Spark's filters (``.where(...)``) are never taken by the reader, whatever
``spark.sql.python.filterPushdown.enabled`` says: Spark applies them to the rows read. PySpark
4.3.0 keeps the partitions and read function planned by ``pushFilters`` on the data source
object that every scan of the DataFrame shares (``PythonDataSourceV2.setReadInfo``), and every
scan reads whatever the last ``pushFilters`` planned; a query that pushes no filter reuses it.
So a DataFrame or view scanned twice (a self-join, a view used twice in one query, a correlated
subquery, a second query) would read splits pruned for another scan's filter. Nothing a reader
sees tells those scans apart, so no pruning by pushed filters is safe; the ``filter`` option is,
because it belongs to the DataFrame and every scan of it means the same rows.
tests/spark/test_spark_multiscan.py checks both settings.

The pieces a streaming reader or writer needs are functions here, not reader methods:
:func:`open_table`, :func:`split_partitions`, :func:`read_partition` and the staged write of
:mod:`arrowlake.table.staged`.
"""

from __future__ import annotations

import base64
import functools
import inspect
import json
import os
import pickle
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from arrowlake.errors import ArrowlakeError, NotFound, ValidationError
from arrowlake.expressions import Expr, to_expression
from arrowlake.io.storage import normalize_location
from arrowlake.lazy import lazy_module
from arrowlake.scan.split import Split
from arrowlake.spark.types import (
    from_spark_batch,
    spark_arrow_schema,
    spark_schema,
    to_spark_batch,
)
from arrowlake.units import parse_duration_seconds

if TYPE_CHECKING:
    import sqlalchemy as sa

    from arrowlake import lake as lakes
    from arrowlake.metastore import inflight
    from arrowlake.scan.scan import Scan
    from arrowlake.table import staged as staging
    from arrowlake.table.staged import StagedWrite, WriteMode, WriteTarget
    from arrowlake.table.table import Table
else:
    # What only the driver runs (the metastore, planning, committing), imported on first use:
    # an executor's Python worker imports this module to read a split and never needs them.
    sa = lazy_module("sqlalchemy")
    lakes = lazy_module("arrowlake.lake")
    inflight = lazy_module("arrowlake.metastore.inflight")  # SQLAlchemy: the driver's only
    staging = lazy_module("arrowlake.table.staged")

FORMAT = "arrowlake"
#: An internal option: pickled splits planned by arrowlake.spark.fast, read as they are.
SPLITS_OPTION = "arrowlake.splits"

Method = TypeVar("Method", bound=Callable[..., Any])


def in_pyspark_worker() -> bool:
    """Whether this process is one of PySpark's Python workers (forked by ``pyspark.daemon``,
    or started as a ``pyspark.*`` module), not the user's own."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and str(spec.name).startswith("pyspark.")


def _message_first() -> None:
    """The arrowlake error being raised, reported by PySpark's worker without a traceback.

    PySpark sends the JVM the worker's traceback as the error's text, so the user read
    ``[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: Traceback (most
    recent call last):`` and a screen of arrowlake's frames before the message. An arrowlake
    error says what was wrong and what to do; its frames add nothing. PySpark's own switch for
    that (``spark.sql.execution.pyspark.udf.hideTraceback.enabled``, which reaches the worker
    as ``SPARK_HIDE_TRACEBACK``, read when it reports an error) is set for this error only: a
    worker reporting an error exits right after, so nothing else it runs is affected. The
    text then starts ``arrowlake.errors.FilterSyntaxError: Expected a value ...``."""
    if in_pyspark_worker():
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"


def user_facing(method: Method) -> Method:
    """For the methods PySpark calls with the user's options: arrowlake's errors reach the user
    with their message first (:func:`_message_first`). Generator methods are covered while
    they run."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def generate(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from method(*args, **kwargs)
            except ArrowlakeError:
                _message_first()
                raise

        return generate  # type: ignore[return-value]

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except ArrowlakeError:
            _message_first()
            raise

    return call  # type: ignore[return-value]


def encode_splits(splits: Sequence[Split]) -> str:
    return base64.b64encode(pickle.dumps(list(splits))).decode("ascii")


def decode_splits(text: str) -> list[Split]:
    splits = pickle.loads(base64.b64decode(text))
    if not isinstance(splits, list) or not all(isinstance(s, Split) for s in splits):
        raise ValidationError(f"Option {SPLITS_OPTION!r} does not hold arrowlake splits")
    return splits


# -- options --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LakeOptions:
    """Where the lake is: the arguments of :func:`arrowlake.connect`."""

    uri: str
    warehouse: str | None = None
    storage_json: str = "{}"  # the storage options as sorted JSON (options may nest)

    @classmethod
    def create(cls, uri: str, warehouse: str | None = None,
               storage_options: Mapping[str, Any] | None = None) -> LakeOptions:
        return cls(uri, warehouse, json.dumps(dict(storage_options or {}), sort_keys=True))

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> LakeOptions:
        storage: dict[str, Any] = {}
        if options.get("storageoptions"):
            storage.update(json.loads(options["storageoptions"]))
        for key, value in options.items():
            if key.lower().startswith("storage."):
                storage[key[len("storage."):]] = value
        # Without option('lake'): the default lake of the environment ($ARROWLAKE_LAKE).
        where = lakes.lake_address(options.get("lake") or None,
                                   warehouse=options.get("warehouse") or None,
                                   storage_options=storage, given_by="option('lake', ...)")
        return cls.create(where.uri, where.warehouse, where.storage_options)


_LAKES: dict[LakeOptions, lakes.Lake] = {}
_LAKES_LOCK = threading.Lock()


def _require_lake(uri: str) -> None:
    """Refuse a lake that does not exist yet: :func:`arrowlake.connect` would create one
    wherever it is pointed, so a typo in option('lake') would leave a stray lake behind (on the
    driver and on every executor) before failing with TableNotFound."""
    if "://" not in uri or uri.startswith("file://"):
        database = os.path.join(normalize_location(uri), "arrowlake.db")
    elif uri.startswith("sqlite"):
        database = sa.engine.make_url(uri).database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            return
    else:
        return  # a database server: its lake is its metastore tables, created on first use
    if not os.path.exists(database):
        raise NotFound(
            f"No lake at {uri!r} (no {database} there): check option('lake', ...); a new lake "
            "is made with arrowlake.connect(...) or 'arrowlake import --create'")


def open_lake(where: LakeOptions) -> lakes.Lake:
    """The lake, connected once per process; a lake that does not exist is refused."""
    with _LAKES_LOCK:
        lake = _LAKES.get(where)
        if lake is None:
            _require_lake(where.uri)
            lake = lakes.connect(where.uri, warehouse=where.warehouse,
                                 storage_options=json.loads(where.storage_json) or None)
            _LAKES[where] = lake
        return lake


def table_name(options: Mapping[str, str]) -> str:
    name = options.get("path") or options.get("table")
    if not name:
        # saveAsTable hands a Python data source no name (PySpark 4.1-4.3);
        # so does a declarative pipeline's materialized view (arrowlake.spark.pipelines).
        raise ValidationError(
            "Name the table: spark.read.format('arrowlake').load('namespace.table') or "
            ".save('namespace.table'). PySpark hands the arrowlake writer no table name in "
            "saveAsTable() or a pipeline's @dp.materialized_view: use .save(), or "
            "in a pipeline @dp.table(format='arrowlake') or dp.create_sink(name, "
            "format='arrowlake', options={'path': 'namespace.table'})")
    return str(name)


def open_table(options: Mapping[str, str]) -> Table:
    return open_lake(LakeOptions.from_options(options)).table(table_name(options))


@dataclass(frozen=True)
class ReadOptions:
    snapshot: int | None = None
    as_of: datetime | None = None
    tag: str | None = None
    columns: tuple[str, ...] | None = None
    split_size: int | None = None
    min_partitions: int = 1
    filter: str | None = None  # an arrowlake filter, applied by every scan of the DataFrame

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ReadOptions:
        snapshot = options.get("snapshot")
        columns = options.get("columns")
        split_size = options.get("splitsize")
        min_partitions = options.get("minpartitions")
        try:
            return cls(int(snapshot) if snapshot not in (None, "") else None,
                       _as_of(options.get("asof")), options.get("tag") or None,
                       tuple(c.strip() for c in columns.split(",") if c.strip())
                       if columns else None,
                       _bytes(split_size) if split_size else None,
                       int(min_partitions) if min_partitions else os.cpu_count() or 1,
                       options.get("filter") or None)
        except ValueError as exc:
            raise ValidationError(f"Invalid arrowlake read option: {exc}") from None


def _as_of(value: str | None) -> datetime | None:
    """``asOf``: epoch milliseconds, or an ISO date-time (taken as
    :meth:`arrowlake.table.Table.scan` takes ``as_of``)."""
    if not value:
        return None
    text = str(value).strip()
    try:
        return (datetime.fromtimestamp(int(text) / 1000, UTC) if text.isdigit()
                else datetime.fromisoformat(text))
    except (ValueError, OverflowError, OSError):
        raise ValueError(f"asOf={text!r} is neither an ISO date-time (2026-11-01T08:00:00"
                         "+00:00) nor epoch milliseconds") from None


def _bytes(text: str) -> int:
    """``"134217728"``, ``"128m"``, ``"1g"``: a size in bytes."""
    text = str(text).strip().lower().removesuffix("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:], 1)
    value = int(text[:-1] if scale > 1 else text)
    if value <= 0:
        raise ValueError(f"splitSize must be positive, got {text!r}")
    return value * scale


def table_scan(table: Table, read: ReadOptions, filter: Expr | str | None = None,
               columns: Sequence[str] | None = None) -> Scan:
    """The scan a read option set describes (``filter`` and ``columns`` override
    ``read.filter`` and ``read.columns``)."""
    cols = columns if columns is not None else read.columns
    return table.scan(filter if filter is not None else read.filter,
                      list(cols) if cols is not None else None,
                      snapshot=read.snapshot, as_of=read.as_of, tag=read.tag)


def source_schema(options: Mapping[str, str]) -> pa.Schema:
    """The Arrow schema a read with these options returns."""
    if SPLITS_OPTION in options:
        splits = decode_splits(options[SPLITS_OPTION])
        if not splits:
            raise ValidationError(f"Option {SPLITS_OPTION!r} holds no splits")
        return splits[0].output_schema()
    return table_scan(open_table(options), ReadOptions.from_options(options)).schema


# -- reading ------------------------------------------------------------------------------------


class SplitPartition(InputPartition):
    """One input partition: one split of the scan (None for the single empty partition of an
    empty scan)."""

    def __init__(self, split: Split | None) -> None:
        super().__init__(split)
        self.split = split


def plan_splits(scan: Scan, split_size: int | None = None, min_partitions: int = 1
                ) -> list[Split]:
    """The scan's splits. Without an explicit ``split_size``, splits are made smaller when the
    default size would give fewer than ``min_partitions`` (Spark would leave cores idle)."""
    return scan.plan(split_size, min_partitions)


def split_partitions(scan: Scan, split_size: int | None = None,
                     min_partitions: int = 1) -> list[SplitPartition]:
    """One input partition per split of the IO layer (merged primary-key buckets included)."""
    splits = plan_splits(scan, split_size, min_partitions)
    return [SplitPartition(s) for s in splits] or [SplitPartition(None)]


def read_partition(partition: SplitPartition, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The partition's rows as batches of exactly the Arrow schema ``target`` Spark expects."""
    if partition.split is None:
        return
    for batch in partition.split.to_batches():
        yield to_spark_batch(batch, target)


class ArrowlakeReader(DataSourceReader):
    """Plans on the driver (one partition per split); executors read splits.

    It keeps ``DataSourceReader.pushFilters``, which takes no filter: Spark applies every
    filter of the query itself (see the module docstring for why no pushed filter is safe).
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = dict(options)
        self.columns = tuple(schema.fieldNames())
        self.target = spark_arrow_schema(schema)

    @user_facing
    def partitions(self) -> Sequence[InputPartition]:
        if SPLITS_OPTION in self.options:
            # Planned by arrowlake.spark.read, its filter already in each split.
            return [SplitPartition(s) for s in decode_splits(self.options[SPLITS_OPTION])] \
                or [SplitPartition(None)]
        read = ReadOptions.from_options(self.options)
        scan = table_scan(open_table(self.options), read, columns=self.columns)
        return split_partitions(scan, read.split_size, read.min_partitions)

    @user_facing
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SplitPartition)
        yield from read_partition(partition, self.target)


# -- writing ------------------------------------------------------------------------------------


@dataclass
class StagedMessage(WriterCommitMessage):
    staged: StagedWrite


def write_mode(options: Mapping[str, str], overwrite: bool) -> WriteMode:
    """The write mode of Spark's save mode and the ``write`` option."""
    requested = str(options.get("write") or "append").lower()
    if overwrite:
        if requested != "append":
            raise ValidationError(
                f"mode('overwrite') replaces rows; it does not combine with write={requested!r}")
        return "overwrite"
    if requested not in ("append", "upsert", "changes"):
        raise ValidationError(
            f"Unknown option write={requested!r}: use append, upsert or changes")
    return requested  # type: ignore[return-value]


class ArrowlakeWriter(DataSourceArrowWriter):
    """Executors stage files through the library's writers; the driver commits once."""

    def __init__(self, options: Mapping[str, str], overwrite: bool) -> None:
        self.options = dict(options)
        self.mode = write_mode(options, overwrite)
        where = options.get("replacewhere")
        self.replace_where: Expr | None = to_expression(where) if where else None
        self.row_kind = str(options.get("rowkind") or "op")
        self.commit_id = options.get("commitid") or None
        table = open_table(options)
        staging.check_mode(table.state, self.mode, self.replace_where)
        # Detached: PySpark makes this writer in one Python process on the driver and commits
        # in another, so no process holds the registration; its lease alone keeps it.
        self.target: WriteTarget = staging.write_target(
            table.state, "spark", detached_lease=write_lease(options))

    @user_facing
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        order = context.partitionId() if context is not None else 0
        first = next(iterator, None)
        if first is None:
            return StagedMessage(staging.StagedWrite((), 0, order))
        schema = self.target.schema
        head = from_spark_batch(first, schema)
        reader = pa.RecordBatchReader.from_batches(head.schema, _chain(head, (
            from_spark_batch(b, schema) for b in iterator)))
        return StagedMessage(staging.stage(self.target, reader, self.mode,
                                           replace_where=self.replace_where,
                                           row_kind=self.row_kind, order=order))

    @user_facing
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = [m.staged for m in messages if isinstance(m, StagedMessage)]
        table = open_table(self.options)
        try:
            staging.commit_staged(table.state, staged, self.mode, replace_where=self.replace_where,
                                  commit_id=self.commit_id)
        finally:
            self.target.finish(table._metastore)

    @user_facing
    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        staging.discard_staged(self.target, [m.staged for m in messages
                                             if isinstance(m, StagedMessage)])
        self.target.finish(open_table(self.options)._metastore)


def write_lease(options: Mapping[str, str]) -> float:
    """Option ``writeLease``: how long a write's registration lasts without a commit (see
    :data:`arrowlake.metastore.inflight.DETACHED_LEASE_SECONDS`, the default)."""
    text = options.get("writelease")
    if not text:
        return float(inflight.DETACHED_LEASE_SECONDS)
    try:
        return parse_duration_seconds(text)
    except ValueError as exc:
        raise ValidationError(f"Option writeLease: {exc}") from None


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


# -- the source ---------------------------------------------------------------------------------


class ArrowlakeDataSource(DataSource):
    """``format("arrowlake")``: batch reads and writes of arrowlake tables."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def table_schema(self) -> pa.Schema:
        """The Arrow schema of a read with these options, looked up once per instance (it
        travels with the instance PySpark pickles for its other workers)."""
        cached: pa.Schema | None = self.__dict__.get("_table_schema")
        if cached is None:
            cached = self._table_schema = source_schema(self.options)
        return cached

    @user_facing
    def schema(self) -> StructType:
        return spark_schema(self.table_schema())

    @user_facing
    def reader(self, schema: StructType) -> DataSourceReader:
        return ArrowlakeReader(self.options, schema)

    @user_facing
    def writer(self, schema: StructType, overwrite: bool) -> ArrowlakeWriter:
        return ArrowlakeWriter(self.options, overwrite)
