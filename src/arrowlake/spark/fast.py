"""The fast path: Spark's own vectorized Parquet reader where no merge is needed.

Spark's Parquet reader reads arrowlake's data files (every encoding the writer uses, decimals,
lists, timestamps) about twice as fast as any Python source can hand rows to Spark. So
:func:`read` plans the scan with arrowlake (snapshot, pruning by partition, key and statistics)
and then reads

- with ``spark.read.parquet``: every file of an append table, and the files of primary-key
  buckets that need no merge (one run, or runs of disjoint keys holding only additions), one
  read per schema version, columns picked by field id and renamed to the current names
  (renamed columns read under their old names, added ones as nulls, widened ones cast);
- through the ``arrowlake`` data source: buckets whose runs must be merged, files on storage
  Spark cannot reach (object stores without Hadoop's S3A on Spark's classpath), and files
  holding types Spark's reader does not take (nanosecond timestamps, times, durations, float16,
  decimals over 38 digits, fixed-size binaries).

:func:`plan_read` says what goes which way (``FastReadPlan.describe()``); :func:`read` logs it.

>>> df = arrowlake.spark.read(spark, "./lake", "shop.orders",        # doctest: +SKIP
...                           filter="day = '2026-11-01'")
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as st

from arrowlake.errors import ValidationError
from arrowlake.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    Column,
    Comparison,
    Expr,
    In,
    IsNotNull,
    IsNull,
    Not,
    Or,
    StartsWith,
    referenced_columns,
)
from arrowlake.io.storage import LocalStorage, Storage
from arrowlake.lake import Lake
from arrowlake.scan.read import bucket_groups, needs_merge
from arrowlake.scan.split import FileTask, Split
from arrowlake.schema import field_id
from arrowlake.spark.source import (
    FORMAT,
    SPLITS_OPTION,
    LakeOptions,
    ReadOptions,
    encode_splits,
    open_lake,
    plan_splits,
    table_scan,
)
from arrowlake.spark.types import spark_type

log = logging.getLogger("arrowlake.spark")

@dataclass(frozen=True)
class ParquetGroup:
    """Files of one schema version that Spark's Parquet reader reads."""

    paths: tuple[str, ...]  # as Spark names them (file:///..., s3a://...)
    file_schema: pa.Schema
    rows: int


@dataclass
class FastReadPlan:
    """What :func:`read` reads with Spark's Parquet reader and what through the data source."""

    schema: pa.Schema  # the scan's output schema
    table_schema: pa.Schema
    filter: Expr
    parquet: list[ParquetGroup] = field(default_factory=list)
    source: list[Split] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why files go through the data source

    def describe(self) -> str:
        pq_files = sum(len(g.paths) for g in self.parquet)
        src_files = sum(len(s.files) for s in self.source)
        text = (f"{pq_files} files ({sum(g.rows for g in self.parquet)} rows) through Spark's "
                f"Parquet reader, {src_files} files in {len(self.source)} splits through the "
                "arrowlake data source")
        return text + (f" ({'; '.join(self.reasons)})" if self.reasons else "")

    def to_dataframe(self, spark: SparkSession) -> DataFrame:
        out = spark_struct(self.schema)
        frames = [_parquet_frame(spark, g, self) for g in self.parquet]
        if self.source:
            frames.append(spark.read.format(FORMAT)
                          .option(SPLITS_OPTION, encode_splits(self.source)).load())
        if not frames:
            return spark.createDataFrame([], out)
        return reduce(lambda a, b: a.unionByName(b), frames)


def spark_struct(schema: pa.Schema) -> st.StructType:
    return st.StructType([st.StructField(f.name, spark_type(f.type), f.nullable)
                          for f in schema])


def _spark_readable(typ: pa.DataType) -> bool:
    """Whether Spark's Parquet reader reads the type as :func:`spark_type` maps it."""
    t = pa.types
    if t.is_struct(typ):
        return all(_spark_readable(typ.field(i).type) for i in range(typ.num_fields))
    if t.is_list(typ) or t.is_large_list(typ):
        return _spark_readable(typ.value_type)
    if t.is_map(typ):
        return _spark_readable(typ.key_type) and _spark_readable(typ.item_type)
    if t.is_timestamp(typ):
        return typ.unit in ("ms", "us")
    if t.is_decimal(typ):
        return typ.precision <= 38
    return (t.is_integer(typ) or t.is_boolean(typ) or t.is_float32(typ) or t.is_float64(typ)
            or t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ)
            or t.is_binary(typ) or t.is_large_binary(typ) or t.is_binary_view(typ)
            or t.is_date(typ) or (t.is_dictionary(typ) and _spark_readable(typ.value_type)))


def _column_sources(table_schema: pa.Schema, file_schema: pa.Schema, needed: Sequence[str]
                    ) -> dict[str, pa.Field | None] | None:
    """Per needed column, the file's field with the same id (None: added later), or None when
    Spark could not read the version's columns as the current types."""
    by_id = {field_id(f): f for f in file_schema}
    out: dict[str, pa.Field | None] = {}
    for name in needed:
        current = table_schema.field(name)
        old = by_id.get(field_id(current))
        if old is not None:
            if not _spark_readable(old.type) or not _spark_readable(current.type):
                return None
            nested = pa.types.is_nested(old.type) or pa.types.is_nested(current.type)
            if nested and spark_type(old.type) != spark_type(current.type):
                return None  # nested children changed: casting by position could mix them up
        elif not _spark_readable(current.type):
            return None
        out[name] = old
    return out


def _spark_path(storage: Storage, path: str, spark: SparkSession | None) -> str | None:
    if isinstance(storage, LocalStorage):
        return "file://" + path
    if path.startswith("s3://") and spark is not None and _has_s3a(spark):
        return "s3a://" + path[len("s3://"):]
    return None


def _has_s3a(spark: SparkSession) -> bool:
    try:
        jvm: Any = spark._jvm  # absent under Spark Connect
        jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3AFileSystem")
        return True
    except Exception:
        return False


def _needed(schema_names: Sequence[str], expr: Expr) -> list[str]:
    needed = list(schema_names)
    for c in sorted(referenced_columns(expr)):
        if c not in needed:
            needed.append(c)
    return needed


def plan_read(spark: SparkSession | None, lake: Lake | str, table: str, *,
              filter: Expr | str | None = None, columns: Sequence[str] | None = None,
              snapshot: int | None = None, as_of: datetime | None = None,
              tag: str | None = None, warehouse: str | None = None,
              storage_options: Mapping[str, Any] | None = None) -> FastReadPlan:
    """Plan a read: which files Spark's Parquet reader takes and which splits the data source
    reads (see the module docstring)."""
    if isinstance(lake, str):
        lake = open_lake(LakeOptions.create(lake, warehouse, storage_options))
    scan = table_scan(lake.table(table), ReadOptions(snapshot, as_of, tag), filter, columns)
    plan = FastReadPlan(scan.schema, scan.view.schema, scan.expr)
    reasons: set[str] = set()
    by_schema: dict[int, tuple[Split, list[FileTask]]] = {}
    cores = spark.sparkContext.defaultParallelism if spark is not None else 1
    for split in plan_splits(scan, None, cores):
        direct: list[FileTask] = []
        if split.merge is None:
            direct = [f for f in split.files if f.deletes is None or not f.deletes.cardinality]
            if len(direct) < len(split.files):
                reasons.add("files with deleted rows (deletion vectors)")
        else:
            direct = [f for g in bucket_groups(split.files) if not needs_merge(g) for f in g]
            if len(direct) < len(split.files):
                reasons.add("buckets whose runs must be merged")
        reachable = [f for f in direct if _spark_path(split.storage, f.path, spark)]
        if len(reachable) < len(direct):
            reasons.add("storage Spark's reader cannot reach")
        readable = []
        for f in reachable:
            if _column_sources(split.schema, split.file_schemas[f.schema_id],
                               _needed(split.columns, split.filter)) is None:
                reasons.add("column types Spark's Parquet reader does not read")
            else:
                readable.append(f)
        for f in readable:
            by_schema.setdefault(f.schema_id, (split, []))[1].append(f)
        taken = set(readable)
        rest = [f for f in split.files if f not in taken]
        if rest:
            plan.source.append(replace(split, files=tuple(rest)))
    for _, (split, files) in sorted(by_schema.items()):
        paths = tuple(p for f in files if (p := _spark_path(split.storage, f.path, spark)))
        plan.parquet.append(ParquetGroup(paths, split.file_schemas[files[0].schema_id],
                                         sum(f.row_count for f in files)))
    plan.reasons = sorted(reasons)
    return plan


def _parquet_frame(spark: SparkSession, group: ParquetGroup, plan: FastReadPlan) -> DataFrame:
    needed = _needed(plan.schema.names, plan.filter)
    sources = _column_sources(plan.table_schema, group.file_schema, needed)
    assert sources is not None
    read_schema = st.StructType([st.StructField(old.name, spark_type(old.type), True)
                                 for old in sources.values() if old is not None])
    df = spark.read.schema(read_schema).parquet(*group.paths)
    columns = []
    for name in needed:
        typ = spark_type(plan.table_schema.field(name).type)
        old = sources[name]
        if old is None:
            columns.append(F.lit(None).cast(typ).alias(name))
        else:
            columns.append(F.col(_quote(old.name)).cast(typ).alias(name))
    df = df.select(*columns)
    if not isinstance(plan.filter, AlwaysTrue):
        df = df.where(spark_filter(plan.filter))
    return df.select(*[_quote(c) for c in plan.schema.names])


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def spark_filter(expr: Expr) -> SparkColumn:
    """An arrowlake filter as a Spark column expression (same null semantics: rows where the
    filter is null are dropped by both)."""
    if isinstance(expr, AlwaysTrue):
        return F.lit(True)
    if isinstance(expr, AlwaysFalse):
        return F.lit(False)
    if isinstance(expr, (And, Or)):  # n-ary: recursion only as deep as AND/OR nest
        # Generated filters OR thousands of equalities: one isin per column instead of a
        # Column (several JVM calls) per term. Spark's IN is its OR of =, NaN and all.
        same: dict[str, list[Any]] = {}
        rest: list[Expr] = []
        for child in expr.children:
            if (isinstance(expr, Or) and isinstance(child, Comparison) and child.op == "="
                    and not isinstance(child.right, Column)):
                same.setdefault(child.left.name, []).append(child.right.value)
            else:
                rest.append(child)
        parts = [F.col(_quote(name)).isin(values) for name, values in same.items()]
        parts += [spark_filter(child) for child in rest]
        while len(parts) > 1:  # a balanced tree: Catalyst walks expressions recursively
            pairs = [(a & b) if isinstance(expr, And) else (a | b)
                     for a, b in zip(parts[::2], parts[1::2], strict=False)]
            parts = [*pairs, parts[-1]] if len(parts) % 2 else pairs
        return parts[0]
    if isinstance(expr, Not):
        return ~spark_filter(expr.child)
    if isinstance(expr, Comparison):
        left = F.col(_quote(expr.left.name))
        right = (F.col(_quote(expr.right.name)) if isinstance(expr.right, Column)
                 else F.lit(expr.right.value))
        ops = {"=": left == right, "!=": left != right, "<": left < right,
               "<=": left <= right, ">": left > right, ">=": left >= right}
        return ops[expr.op]
    if isinstance(expr, In):
        return F.col(_quote(expr.column.name)).isin(list(expr.values))
    if isinstance(expr, IsNull):
        return F.col(_quote(expr.column.name)).isNull()
    if isinstance(expr, IsNotNull):
        return F.col(_quote(expr.column.name)).isNotNull()
    if isinstance(expr, StartsWith):
        return F.col(_quote(expr.column.name)).startswith(expr.prefix)
    raise ValidationError(f"Filter {expr} has no Spark form")


def read(spark: SparkSession, lake: Lake | str, table: str, *,
         filter: Expr | str | None = None, columns: Sequence[str] | None = None,
         snapshot: int | None = None, as_of: datetime | None = None, tag: str | None = None,
         warehouse: str | None = None,
         storage_options: Mapping[str, Any] | None = None) -> DataFrame:
    """A table as a DataFrame, read by Spark's Parquet reader wherever no merge is needed.

    Same rows as ``spark.read.format("arrowlake")`` with the same options; ``filter`` (an
    arrowlake filter) prunes files and is applied to the rows.
    """
    plan = plan_read(spark, lake, table, filter=filter, columns=columns, snapshot=snapshot,
                     as_of=as_of, tag=tag, warehouse=warehouse, storage_options=storage_options)
    log.info("arrowlake.spark.read(%s): %s", table, plan.describe())
    return plan.to_dataframe(spark)
