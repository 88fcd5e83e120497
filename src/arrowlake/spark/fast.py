"""The fast path: Spark's own vectorized Parquet reader where no merge is needed.

Spark's Parquet reader reads arrowlake's data files (every encoding the writer uses, decimals,
lists, timestamps) about twice as fast as any Python source can hand rows to Spark. So
:func:`read` plans the scan with arrowlake (snapshot, pruning by partition, key and statistics)
and then reads

- with ``spark.read.parquet``: every file of an append table, and the files of primary-key
  buckets that need no merge (one run, or runs of disjoint keys holding only additions), one
  read per schema version, columns picked by field id and renamed to the current names
  (renamed columns read under their old names, added ones as nulls, widened ones cast);
- with ``spark.read.parquet`` too, files with a deletion vector (merge-on-write primary-key
  tables): Spark reads each row's position in its file (``_metadata.row_index``) and the
  file's size (``_metadata.file_size``, which tells the files of one read apart: files of
  equal size go to different reads), and the deleted rows are dropped by a ``NOT IN`` list
  (few deleted rows), a bitmap over the files' rows (files of a few million rows) or a left
  anti-join (see :func:`_drop_deleted`), all built on the driver from the vectors;
- on S3 through Hadoop's S3A (``spark.jars.packages``, see :mod:`arrowlake.spark.s3a`), with
  the lake's storage options as S3A settings of the bucket, given to each read;
- through the ``arrowlake`` data source: buckets whose runs must be merged, files on storage
  Spark cannot reach (object stores without Hadoop's S3A on Spark's classpath: a warning names
  the package, once), files
  holding types Spark's reader does not take (nanosecond timestamps, times, durations, float16,
  decimals over 38 digits, fixed-size binaries), and, on Spark before 4.3, files storing a
  float column the read takes BYTE_STREAM_SPLIT (``write.encodings = byte-stream-split``, and
  the default until it stopped; their footers say so), which Spark's reader decodes from 4.3.

:func:`plan_read` says what goes which way (``FastReadPlan.describe()``); :func:`read` logs it.

>>> df = arrowlake.spark.read(spark, "./lake", "shop.orders",        # doctest: +SKIP
...                           filter="day = '2026-11-01'")
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as st

from arrowlake.expressions import (
    AlwaysTrue,
    Expr,
    referenced_columns,
)
from arrowlake.io.deletion_vectors import VectorRef
from arrowlake.io.object_store import ObjectStorage
from arrowlake.io.storage import LocalStorage, Storage
from arrowlake.lake import Lake, lake_address
from arrowlake.scan.read import bucket_groups, file_fragment, needs_merge
from arrowlake.scan.split import FileTask, Split
from arrowlake.schema import field_id
from arrowlake.spark import s3a
from arrowlake.spark.filters import to_spark_sql
from arrowlake.spark.session import default_parallelism, is_connect, spark_version
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

#: A group of files with up to this many deleted rows drops them by a ``NOT IN`` list.
LIST_DELETES = 1024
#: Files with deletion vectors drop their deleted rows by a bitmap of one bit per row (which
#: reaches each executor once, in the stage's task binary) while the bitmaps of a read take
#: up to this many bytes in all, or up to what the anti-join would ship (16 bytes a deleted
#: row), and never more than :data:`BITMAP_MAX_BYTES`.
BITMAP_BYTES = 4 * 1024 * 1024
BITMAP_MAX_BYTES = 256 * 1024 * 1024
#: Other groups drop them by a left anti-join, broadcast up to this many deleted rows (more
#: are joined as Spark chooses, which bounds the memory of the driver and each executor).
BROADCAST_DELETES = 16_000_000
#: The first Spark whose vectorized Parquet reader decodes BYTE_STREAM_SPLIT (4.1 and 4.2 fail
#: with "Unsupported encoding: BYTE_STREAM_SPLIT"): before it, files that store a float column
#: the read takes so go through the data source (arrowlake's reader decodes every encoding).
SPLIT_FLOATS_SPARK = (4, 3)
#: Deleted positions go to Spark as rows holding arrays of this many (one row per position
#: costs the JVM several times as much to take in).
_KEYS_PER_ROW = 65_536


@dataclass(frozen=True)
class VectorFile:
    path: str  # absolute location, for reading the vector
    size: int  # bytes: Spark's _metadata.file_size
    rows: int
    vector: VectorRef | None  # None: a file of the read with no deleted row

    @property
    def deleted(self) -> int:
        return self.vector.cardinality if self.vector is not None else 0


@dataclass(frozen=True)
class DeletedRows:
    """The deletion vectors of a :class:`ParquetGroup`'s files (in the order of its paths),
    and how Spark drops the rows they delete (``method``, see :func:`_drop_deleted`). The
    files of a group have distinct sizes: ``_metadata.file_size`` tells them apart."""

    storage: Storage
    table: str
    files: tuple[VectorFile, ...]
    method: str = "join"  # "list", "bitmap" or "join"

    @property
    def count(self) -> int:
        return sum(f.deleted for f in self.files)

    @property
    def with_vectors(self) -> int:
        """The files of the read that have deleted rows."""
        return sum(f.deleted > 0 for f in self.files)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def stride(self) -> int:
        """For ``list`` and ``join``: a row's key is ``file_size * stride + row_index``."""
        return max(f.rows for f in self.files) if len(self.files) > 1 else 0

    def positions(self) -> list[np.ndarray]:
        """Each file's deleted positions (int64), read from the vectors."""
        return [np.zeros(0, np.int64) if f.vector is None or not f.deleted
                else f.vector.positions(self.storage, f.path).astype(np.int64)
                for f in self.files]

    def keys(self) -> np.ndarray:
        """The deleted rows' keys ``file_size * stride + position``."""
        return np.concatenate([p + np.int64(f.size * self.stride)
                               for f, p in zip(self.files, self.positions(), strict=True)])


@dataclass(frozen=True)
class ParquetGroup:
    """Files of one schema version that Spark's Parquet reader reads."""

    paths: tuple[str, ...]  # as Spark names them (file:///..., s3a://...)
    file_schema: pa.Schema
    rows: int  # live rows (deleted rows not counted)
    deletes: DeletedRows | None = None  # the files' deletion vectors, if they have any
    # Options of the read (S3A settings of the files' bucket: credentials, never shown).
    options: tuple[tuple[str, str], ...] = field(default=(), repr=False)


_METHODS = {"list": "NOT IN list", "bitmap": "bitmap", "join": "anti-join"}


@dataclass
class FastReadPlan:
    """What :func:`read` reads with Spark's Parquet reader and what through the data source."""

    schema: pa.Schema  # the scan's output schema
    table_schema: pa.Schema
    filter: Expr
    # The filter as Spark SQL keeping exactly arrowlake's rows (spark.filters), applied to
    # the rows Spark's reader reads; None: no filter.
    condition: str | None = None
    parquet: list[ParquetGroup] = field(default_factory=list)
    source: list[Split] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why files go through the data source

    def describe(self) -> str:
        pq_files = sum(len(g.paths) for g in self.parquet)
        src_files = sum(len(s.files) for s in self.source)
        vectors = [g.deletes for g in self.parquet if g.deletes is not None]
        methods = ", ".join(sorted({_METHODS[d.method] for d in vectors}))
        dropped = (f" ({sum(d.with_vectors for d in vectors)} with deletion vectors: "
                   f"{sum(d.count for d in vectors)} deleted rows dropped by position, "
                   f"{methods})" if vectors else "")
        text = (f"{pq_files} files ({sum(g.rows for g in self.parquet)} rows) through Spark's "
                f"Parquet reader{dropped}, {src_files} files in {len(self.source)} splits "
                "through the arrowlake data source")
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
    if s3a.is_s3(path) and spark is not None and _read_options(storage, path) is not None:
        if s3a.has_s3a(spark):
            return s3a.s3a_path(path)
        s3a.warn_missing()
    return None


def _read_options(storage: Storage, path: str) -> dict[str, str] | None:
    """The options of a Spark read of ``path`` (S3A settings of its bucket); None when S3A
    cannot reach it as the lake's storage options say."""
    if not isinstance(storage, ObjectStorage):
        return {}
    return s3a.s3a_options(s3a.bucket_of(path), storage.options)


def _local_spark_version() -> tuple[int, int]:
    import pyspark

    major, minor = str(pyspark.__version__).split(".")[:2]
    return int(major), int(minor)


def _stores_split_floats(storage: Storage, task: FileTask,
                         sources: Mapping[str, pa.Field | None]) -> bool:
    """Whether the file stores a float column the read takes BYTE_STREAM_SPLIT, as its
    footer says (read once per file and process: fragments are cached). arrowlake's writer
    splits top-level float columns only, and wrote them so by default until
    ``write.encodings = auto`` stopped doing it."""
    floats = {f.name for f in sources.values()
              if f is not None and pa.types.is_floating(f.type)}
    if not floats:
        return False
    metadata = file_fragment(storage, task).metadata
    columns = [i for i in range(metadata.num_columns)
               if metadata.schema.column(i).path in floats]
    return any("BYTE_STREAM_SPLIT" in metadata.row_group(g).column(i).encodings
               for g in range(metadata.num_row_groups) for i in columns)


def _needed(schema_names: Sequence[str], expr: Expr) -> list[str]:
    needed = list(schema_names)
    for c in sorted(referenced_columns(expr)):
        if c not in needed:
            needed.append(c)
    return needed


def plan_read(spark: SparkSession | None, lake: Lake | str | None, table: str, *,
              filter: Expr | str | None = None, columns: Sequence[str] | None = None,
              snapshot: int | None = None, as_of: datetime | None = None,
              tag: str | None = None, warehouse: str | None = None,
              storage_options: Mapping[str, Any] | None = None) -> FastReadPlan:
    """Plan a read: which files Spark's Parquet reader takes and which splits the data source
    reads (see the module docstring)."""
    if not isinstance(lake, Lake):  # None: the environment's default lake ($ARROWLAKE_LAKE)
        where = lake_address(lake, warehouse=warehouse, storage_options=storage_options)
        lake = open_lake(LakeOptions.create(where.uri, where.warehouse, where.storage_options))
    scan = table_scan(lake.table(table), ReadOptions(snapshot, as_of, tag), filter, columns)
    plan = FastReadPlan(scan.schema, scan.view.schema, scan.expr)
    reasons: set[str] = set()
    exact = True
    if not isinstance(scan.expr, AlwaysTrue):
        plan.condition = to_spark_sql(scan.expr, scan.view.schema)
        if plan.condition is None:  # arrowlake's reader applies it
            exact = False
            reasons.add("a filter Spark cannot evaluate exactly as arrowlake does")
    by_schema: dict[tuple[int, bool], tuple[Split, list[FileTask]]] = {}
    cores = default_parallelism(spark) if spark is not None else 1
    split_floats_read = (spark_version(spark) if spark is not None
                         else _local_spark_version()) >= SPLIT_FLOATS_SPARK
    for split in plan_splits(scan, None, cores):
        if not exact:
            plan.source.append(split)
            continue
        direct: list[FileTask] = list(split.files)
        if split.merge is not None:
            direct = [f for g in bucket_groups(split.files) if not needs_merge(g) for f in g]
            if len(direct) < len(split.files):
                reasons.add("buckets whose runs must be merged")
        reachable = [f for f in direct if _spark_path(split.storage, f.path, spark)]
        if len(reachable) < len(direct):
            reasons.add("storage Spark's reader cannot reach")
        readable = []
        for f in reachable:
            sources = _column_sources(split.schema, split.file_schemas[f.schema_id],
                                      _needed(split.columns, split.filter))
            if sources is None:
                reasons.add("column types Spark's Parquet reader does not read")
            elif not split_floats_read and _stores_split_floats(split.storage, f, sources):
                reasons.add(f"BYTE_STREAM_SPLIT floats, which Spark's Parquet reader decodes "
                            f"from Spark {SPLIT_FLOATS_SPARK[0]}.{SPLIT_FLOATS_SPARK[1]} on")
            else:
                readable.append(f)
        for f in readable:
            vector = f.deletes is not None and f.deletes.cardinality > 0
            by_schema.setdefault((f.schema_id, vector), (split, []))[1].append(f)
        taken = set(readable)
        rest = [f for f in split.files if f not in taken]
        if rest:
            plan.source.append(replace(split, files=tuple(rest)))
    # A schema version's files without deleted rows are read with its files that have some
    # (one Spark read: making it, listing and planning, costs about what scanning a few
    # million rows does) when that read drops rows by a list or a bitmap, which cost next
    # to nothing per row; an anti-join would cost their rows a join.
    for schema_id in sorted({sid for sid, vector in by_schema if vector}):
        plain = by_schema.get((schema_id, False))
        if plain is None:
            continue
        split, files = by_schema[(schema_id, True)]
        merged = _deleted_rows(split, [*files, *plain[1]])
        if merged.count <= LIST_DELETES or _bitmap_fits(merged.rows // 8, merged):
            files += plain[1]
            del by_schema[(schema_id, False)]
    bitmap_bytes = 0
    for (schema_id, vector), (split, files) in sorted(by_schema.items()):
        file_schema = split.file_schemas[schema_id]
        for part in _key_groups(files) if vector else [files]:
            paths = tuple(p for f in part if (p := _spark_path(split.storage, f.path, spark)))
            deletes = None
            if vector and any(_has_deletes(f) for f in part):
                deletes = _deleted_rows(split, part)
                if deletes.count <= LIST_DELETES:
                    deletes = replace(deletes, method="list")
                elif _bitmap_fits(bitmap_bytes + deletes.rows // 8, deletes) \
                        and _residues(deletes) is not None:
                    deletes = replace(deletes, method="bitmap")
                    bitmap_bytes += deletes.rows // 8
            options = _read_options(split.storage, part[0].path) or {}
            plan.parquet.append(ParquetGroup(paths, file_schema,
                                             sum(f.live_rows for f in part), deletes,
                                             tuple(sorted(options.items()))))
    plan.reasons = sorted(reasons)
    return plan


def _has_deletes(task: FileTask) -> bool:
    return task.deletes is not None and task.deletes.cardinality > 0


def _deleted_rows(split: Split, files: Sequence[FileTask]) -> DeletedRows:
    return DeletedRows(split.storage, split.table, tuple(
        VectorFile(f.path, f.file_size, f.row_count, f.deletes if _has_deletes(f) else None)
        for f in files))


def _key_groups(files: Sequence[FileTask]) -> list[list[FileTask]]:
    """Files with deletion vectors in groups read by one ``spark.read.parquet`` each: the
    files of a group have distinct sizes, so ``_metadata.file_size`` tells them apart, and
    ``file_size * stride + row_index`` (stride: the group's largest row count) fits in 64
    bits. Usually one group; equal sizes make more."""
    groups: list[tuple[list[FileTask], set[int]]] = []
    for f in files:
        for members, sizes in groups:
            stride = max(f.row_count, *(m.row_count for m in members))
            if f.file_size not in sizes and (max(f.file_size, *sizes) + 1) * stride < 2**63:
                members.append(f)
                sizes.add(f.file_size)
                break
        else:
            groups.append(([f], {f.file_size}))
    return [members for members, _ in groups]


def _bitmap_fits(total_bytes: int, deletes: DeletedRows) -> bool:
    """Whether a read whose bitmaps take ``total_bytes`` with the one of ``deletes`` drops
    the rows of ``deletes`` by its bitmap (see :data:`BITMAP_BYTES`)."""
    return total_bytes <= min(BITMAP_MAX_BYTES, max(BITMAP_BYTES, 16 * deletes.count))


def _residues(deletes: DeletedRows) -> int | None:
    """The least modulus ``m`` under which the files' sizes leave distinct remainders (so
    ``pmod(_metadata.file_size, m)`` indexes a table of them), or None if none is small."""
    sizes = np.array([f.size for f in deletes.files], dtype=np.int64)
    for modulus in range(sizes.size, 64 * sizes.size + 64):
        if np.unique(sizes % modulus).size == sizes.size:
            return modulus
    return None


def _drop_deleted(spark: SparkSession, df: DataFrame, deletes: DeletedRows) -> DataFrame:
    """``df`` (a ``spark.read.parquet`` of the group's files, not yet projected) without the
    deleted rows, by the group's method:

    - ``list``: ``key NOT IN (...)``, key ``file_size * stride + row_index`` (Spark makes
      the list a hash set);
    - ``bitmap``: the files' rows numbered one after the other (``offset + row_index``, the
      file's offset found from its size by remainder in a small table); a row is kept when
      its bit in the bitmap of deleted rows is clear. The tables and the bitmap reach Spark
      as one row of long arrays read by one scalar subquery (their values are not part of
      the plan's text);
    - ``join``: a left anti-join on the key against the deleted keys, shipped as rows of
      arrays and exploded in the JVM.

    With every method a row of a file whose size is not a listed one fails the read (the file
    changed after its vector was written, and its positions would be another file's). The
    bitmap method of a classic session leaves working columns, which the caller's projection
    (:func:`_project`) drops."""
    if deletes.method == "bitmap" and not is_connect(spark) \
            and "_metadata" not in {c.lower() for c in df.columns}:
        return _bitmap_where(spark, df, deletes)
    meta = df.metadataColumn("_metadata")  # reachable even if a column is named _metadata
    row, size = meta.getField("row_index"), meta.getField("file_size")
    if deletes.method == "bitmap":
        return df.where(_bitmap_keeps(spark, deletes, row, size))
    key = size * F.lit(deletes.stride) + row if deletes.stride else row
    name = _unused("_arrowlake_row", {c.lower() for c in df.columns})
    # Every row must come from a file of the listed sizes (the key is made of the size).
    listed_size = F.when(size.isin(*[F.lit(f.size) for f in deletes.files]), F.lit(True)) \
        .otherwise(F.raise_error(F.lit(_changed_file(deletes))).cast("boolean"))
    df = df.where(listed_size).select(F.col("*"), key.alias(name))
    keys = deletes.keys()
    if deletes.method == "list":
        listed = ",".join(map(str, keys.tolist()))
        return df.where(F.expr(f"{_quote(name)} NOT IN ({listed})")).drop(name)
    rows = pa.chunked_array([
        pa.ListArray.from_arrays(pa.array([0, len(chunk)], pa.int32()), pa.array(chunk))
        for chunk in np.array_split(keys, range(_KEYS_PER_ROW, keys.size, _KEYS_PER_ROW))])
    deleted = spark.createDataFrame(pa.table({name: rows})).select(F.explode(name).alias(name))
    if keys.size <= BROADCAST_DELETES:
        deleted = F.broadcast(deleted)
    return df.join(deleted, name, "left_anti").drop(name)


def _changed_file(deletes: DeletedRows) -> str:
    return (f"A data file of {deletes.table} read with its deletion vector has a size its "
            "metadata does not list: it changed after it was written")


@dataclass(frozen=True)
class _Bitmap:
    """The lookup tables of the ``bitmap`` method: a file's slot is ``pmod(file_size,
    modulus)``; ``size[slot]`` is the size of the file in it (-1: none), ``offset[slot]`` the
    number of its first row; bit ``i`` of ``words[j]`` is set when row ``64 * j + i`` (rows
    numbered file after file) is deleted."""

    modulus: int
    size: np.ndarray
    offset: np.ndarray
    words: np.ndarray

    @classmethod
    def of(cls, deletes: DeletedRows) -> _Bitmap:
        modulus = _residues(deletes)
        assert modulus is not None
        counts = np.array([f.rows for f in deletes.files], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        sizes = np.array([f.size for f in deletes.files], dtype=np.int64)
        slot_size = np.full(modulus, -1, dtype=np.int64)
        slot_offset = np.zeros(modulus, dtype=np.int64)
        slot_size[sizes % modulus] = sizes
        slot_offset[sizes % modulus] = offsets
        # Built from the sorted positions in memory of the size of the bitmap.
        numbers = np.concatenate([positions + offset for offset, positions
                                  in zip(offsets, deletes.positions(), strict=True)]
                                 ).view(np.uint64)
        bitmap = np.zeros(int(counts.sum()) // 64 + 1, dtype=np.uint64)
        in_word = numbers >> np.uint64(6)
        starts = np.flatnonzero(np.concatenate(([True], in_word[1:] != in_word[:-1])))
        bitmap[in_word[starts]] = np.bitwise_or.reduceat(
            np.left_shift(np.uint64(1), numbers & np.uint64(63)), starts)
        return cls(modulus, slot_size, slot_offset, bitmap.view(np.int64))

    def arrays(self) -> pa.Table:
        """One row, a column of each array: ``size``, ``offset``, ``words``."""
        return pa.table({name: pa.ListArray.from_arrays(pa.array([0, values.size], pa.int32()),
                                                        pa.array(values))
                         for name, values in (("size", self.size), ("offset", self.offset),
                                              ("words", self.words))})

    def tables(self, spark: SparkSession) -> DataFrame:
        """One row, one column ``t``: a struct of the three arrays."""
        return spark.createDataFrame(self.arrays()).select(
            F.struct(*[F.col(c) for c in ("size", "offset", "words")]).alias("t"))


def _bitmap_keeps(spark: SparkSession, deletes: DeletedRows, row: SparkColumn,
                  size: SparkColumn) -> SparkColumn:
    """True for the rows the group's vectors do not delete (the ``bitmap`` method)."""
    bitmap = _Bitmap.of(deletes)
    # One scalar subquery (a struct of the three arrays): one more Spark job when the query
    # runs, and one JVM round trip to build it, instead of three.
    tables = bitmap.tables(spark).scalar()
    by_slot, offset_of, word_of = (tables.getField(c) for c in ("size", "offset", "words"))
    slot = F.pmod(size, F.lit(bitmap.modulus)).cast("int")
    index = F.when(F.get(by_slot, slot) == size, F.get(offset_of, slot)).otherwise(
        F.raise_error(F.lit(_changed_file(deletes))).cast("long")) + row
    word = F.get(word_of, F.shiftright(index, 6).cast("int"))
    return F.bit_get(word, F.pmod(index, F.lit(64)).cast("int")) == 0


#: Temporary views of bitmap tables get this prefix and a number.
_VIEW_PREFIX = "_arrowlake_bitmap_"
_views = itertools.count()


def _bitmap_where(spark: SparkSession, df: DataFrame, deletes: DeletedRows) -> DataFrame:
    """``df`` without the rows the group's vectors delete, as :func:`_bitmap_keeps` drops
    them, built with a handful of JVM round trips instead of a few dozen (each Column call of
    a classic session is one, and they were a quarter of a read of 4M rows). The arrays are a
    temporary view, read once by a scalar subquery into a column of their own beside the
    file size and row index (the condition names the arrays five times: as five subqueries
    it took twice as long to analyze, and longer to run); the three working columns, named
    apart from the files' columns, are left for the caller's projection to drop. A classic
    session analyzes the subquery when the DataFrame is made, so the view is dropped right
    after; a Connect session (which resolves views when the query runs) uses
    :func:`_bitmap_keeps`."""
    bitmap = _Bitmap.of(deletes)
    view = f"{_VIEW_PREFIX}{next(_views)}"
    taken = {c.lower() for c in df.columns}
    size, row, arrays = (_unused(f"_arrowlake_{what}", taken)
                         for what in ("file_size", "row_index", "bitmap"))
    spark.createDataFrame(bitmap.arrays()).createOrReplaceTempView(view)
    try:
        df = df.selectExpr("*", f"_metadata.file_size AS {size}",
                           f"_metadata.row_index AS {row}",
                           f"(SELECT struct(size, offset, words) FROM {view}) AS {arrays}")
    finally:
        spark.catalog.dropTempView(view)
    slot = f"CAST(pmod({size}, {bitmap.modulus}) AS INT)"
    index = (f"(CASE WHEN {arrays}.size[{slot}] = {size} THEN {arrays}.offset[{slot}] "
             f"ELSE CAST(raise_error({_sql_string(_changed_file(deletes))}) AS BIGINT) END"
             f" + {row})")
    return df.where(f"bit_get({arrays}.words[CAST(shiftright({index}, 6) AS INT)], "
                    f"CAST(pmod({index}, 64) AS INT)) = 0")


def _unused(name: str, taken: set[str]) -> str:
    """``name``, with underscores added until no column of ``taken`` (lower-cased) has it."""
    while name.lower() in taken:
        name += "_"
    taken.add(name.lower())
    return name


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _parquet_frame(spark: SparkSession, group: ParquetGroup, plan: FastReadPlan) -> DataFrame:
    needed = _needed(plan.schema.names, plan.filter)
    sources = _column_sources(plan.table_schema, group.file_schema, needed)
    assert sources is not None
    read_schema = st.StructType([st.StructField(old.name, spark_type(old.type), True)
                                 for old in sources.values() if old is not None])
    df = read_files(spark, spark.read.options(**dict(group.options)).schema(read_schema),
                    group.paths)
    condition = plan.condition
    if condition is not None and group.deletes is not None \
            and _as_written(plan.table_schema, sources, referenced_columns(plan.filter)):
        # Before the deleted-row check, which then runs only on the rows the filter keeps:
        # Spark evaluates a filter's conjuncts in order and puts an inner filter's first.
        df, condition = df.where(condition), None
    if group.deletes is not None:
        df = _drop_deleted(spark, df, group.deletes)
    df = _project(df, plan.table_schema, sources)
    if isinstance(plan.filter, AlwaysTrue) and needed == list(plan.schema.names):
        return df  # (each DataFrame call is a round trip to the JVM that analyzes the plan)
    if condition is not None:
        df = df.where(condition)
    return df.select(*[_quote(c) for c in plan.schema.names])


def _as_written(table_schema: pa.Schema, sources: Mapping[str, pa.Field | None],
                columns: Iterable[str]) -> bool:
    """Whether the files hold ``columns`` under their current names and Spark types, so a
    condition over the table's columns reads the files' columns as they are."""
    for name in columns:
        old = sources.get(name)
        if old is None or old.name != name \
                or spark_type(old.type) != spark_type(table_schema.field(name).type):
            return False
    return True


def _project(df: DataFrame, table_schema: pa.Schema, sources: Mapping[str, pa.Field | None]
             ) -> DataFrame:
    """The read columns of ``df`` as the table's ``sources`` columns: renamed, cast to the
    current type, or null where the files predate them. One ``selectExpr`` of SQL text where
    the types have a SQL name (a Column is several JVM round trips in a classic session), a
    ``select`` of Columns for nested types."""
    items: list[str] = []
    for name, old in sources.items():
        typ = spark_type(table_schema.field(name).type)
        if isinstance(typ, (st.StructType, st.ArrayType, st.MapType)):
            break
        if old is None:
            items.append(f"CAST(NULL AS {typ.simpleString()}) AS {_quote(name)}")
        elif spark_type(old.type) != typ:
            items.append(f"CAST({_quote(old.name)} AS {typ.simpleString()}) AS {_quote(name)}")
        else:
            items.append(_quote(old.name) if old.name == name
                         else f"{_quote(old.name)} AS {_quote(name)}")
    else:
        return df.selectExpr(*items)
    columns = []
    for name, old in sources.items():
        typ = spark_type(table_schema.field(name).type)
        if old is None:
            columns.append(F.lit(None).cast(typ).alias(name))
        else:
            columns.append(F.col(_quote(old.name)).cast(typ).alias(name))
    return df.select(*columns)


#: The session setting past which Spark lists a read's paths with a job of its own.
_LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def read_files(spark: SparkSession, reader: Any, paths: Sequence[str]) -> DataFrame:
    """``reader.parquet(*paths)``. Past 32 paths (``_LISTING_THRESHOLD``) Spark lists them with
    a Spark job, one task a path, which cost 0.3 s of a 0.5 s read of 48 local files on
    2 cores: the files are local and known here, so a classic session lists them on the
    driver (the setting is raised while the DataFrame is made, which is when Spark lists,
    then put back). Object stores keep Spark's parallel listing, as does Spark Connect,
    where the server lists when the query runs."""
    local = all(p.startswith("file:") or p.startswith("/") for p in paths)
    if not local or is_connect(spark):
        return reader.parquet(*paths)
    before = spark.conf.get(_LISTING_THRESHOLD)
    if before is None or len(paths) <= int(before):
        return reader.parquet(*paths)
    spark.conf.set(_LISTING_THRESHOLD, str(len(paths)))
    try:
        return reader.parquet(*paths)
    finally:
        spark.conf.set(_LISTING_THRESHOLD, before)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def read(spark: SparkSession, lake: Lake | str | None, table: str, *,
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
