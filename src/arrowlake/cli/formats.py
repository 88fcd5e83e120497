"""Reading CSV, Parquet and JSON-lines files as record batches, and writing them back.

Readers stream: a file is never loaded whole, so importing a file larger than memory works.
Each reader reports how many bytes of its file it has consumed, for the progress bar.
"""

from __future__ import annotations

import base64
import binascii
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from arrowlake.cli.output import dumps
from arrowlake.errors import ValidationError

FORMATS = ("csv", "parquet", "jsonl")

_EXTENSIONS = {
    ".csv": "csv", ".tsv": "csv", ".txt": "csv",
    ".parquet": "parquet", ".pq": "parquet", ".parq": "parquet",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
}
#: Whole-file compression pyarrow undoes while reading CSV and JSON lines.
_COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}

#: Rows per batch when reading Parquet (CSV and JSON batches follow ``BLOCK_BYTES``).
PARQUET_BATCH_ROWS = 64 * 1024
BLOCK_BYTES = 4 * 1024 * 1024


def _suffixes(path: str) -> tuple[str, str | None]:
    """The format suffix and the compression codec of ``path`` (``data.csv.gz`` -> csv, gzip)."""
    p = Path(path)
    suffix = p.suffix.lower()
    codec = _COMPRESSIONS.get(suffix)
    if codec is not None:
        suffix = Path(p.stem).suffix.lower()
    return suffix, codec


def detect_format(path: str, given: str | None) -> str:
    """``given`` when set, else the format the file name says."""
    if given is not None:
        return given
    suffix, _ = _suffixes(path)
    fmt = _EXTENSIONS.get(suffix)
    if fmt is None:
        raise ValidationError(
            f"Cannot tell the format of {path!r} from its extension: pass --format "
            f"{'|'.join(FORMATS)}")
    return fmt


def expand_paths(paths: list[str], fmt: str | None) -> list[str]:
    """Files to read: each path itself, or the data files of a directory (sorted, recursive).

    Names starting with ``.`` or ``_`` (``_SUCCESS``, ``.crc`` files) are skipped.
    """
    out: list[str] = []
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(2, "No such file or directory", path)
        if not os.path.isdir(path):
            out.append(path)
            continue
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
            for name in files:
                if name.startswith((".", "_")):
                    continue
                suffix, _ = _suffixes(name)
                if (fmt is None and suffix in _EXTENSIONS) or \
                        (fmt is not None and _EXTENSIONS.get(suffix, fmt) == fmt):
                    found.append(os.path.join(root, name))
        if not found:
            raise ValidationError(f"The directory {path!r} holds no data files to import")
        out.extend(sorted(found))
    return out


def _typed_columns(hint: pa.Schema | None) -> dict[str, pa.DataType]:
    """Column types a text reader should parse into, so ``"007"`` stays a string column."""
    if hint is None:
        return {}
    return {f.name: f.type for f in hint if not pa.types.is_nested(f.type)}


def _json_text_typed(t: pa.DataType) -> bool:
    """Types JSON carries as strings that the JSON reader cannot parse itself."""
    return pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_binary(t) \
        or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def _json_read_schema(hint: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, pa.string()) if _json_text_typed(f.type) else f
                      for f in hint])


def _from_json_text(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """Dates, times (ISO strings) and bytes (base64, as ``export`` writes them) from JSON text."""
    if pa.types.is_date(t):
        return pc.cast(arr, t)
    if pa.types.is_time(t):
        unit = t.unit
        stamps = pc.cast(pc.binary_join_element_wise("1970-01-01 ", arr, ""),
                         pa.timestamp(unit))
        return pc.cast(stamps, t)
    try:
        return pa.array([None if v is None else base64.b64decode(v, validate=True)
                         for v in arr.to_pylist()], t)
    except binascii.Error as exc:
        raise pa.ArrowInvalid(f"a value of a binary column is not base64: {exc}") from None


def _read_error(path: str, fmt: str, exc: Exception) -> ValidationError:
    return ValidationError(f"Cannot read {path!r} as {fmt}: {exc}")


class FileReader:
    """Record batches of one file; ``schema`` is known as soon as it is opened."""

    def __init__(self, path: str, fmt: str, *, hint: pa.Schema | None = None,
                 delimiter: str | None = None) -> None:
        self.path = path
        self.format = fmt
        self.size = os.path.getsize(path)
        self._raw: Any = None
        self._parquet: pq.ParquetFile | None = None
        self._rows_read = 0
        # Columns read as JSON text that become dates, times or bytes once read.
        self._convert = {f.name: f.type for f in hint or () if fmt == "jsonl"
                         and _json_text_typed(f.type)}
        try:
            if fmt == "parquet":
                self._parquet = pq.ParquetFile(path)
                self.schema = self._parquet.schema_arrow
                self._batches: Iterator[pa.RecordBatch] = self._parquet.iter_batches(
                    batch_size=PARQUET_BATCH_ROWS)
            else:
                self._raw = pa.OSFile(path, "rb")
                suffix, codec = _suffixes(path)
                if delimiter is None and suffix == ".tsv":
                    delimiter = "\t"
                stream = self._raw if codec is None else pa.CompressedInputStream(self._raw, codec)
                reader = self._open_text(stream, fmt, hint, delimiter)
                self.schema = reader.schema
                self._batches = iter(reader)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            self.close()
            raise _read_error(path, fmt, exc) from None

    @staticmethod
    def _open_text(stream: Any, fmt: str, hint: pa.Schema | None,
                   delimiter: str | None) -> pa.RecordBatchReader:
        if fmt == "csv":
            if delimiter is None:
                delimiter = ","
            return pacsv.open_csv(
                stream,
                read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES),
                parse_options=pacsv.ParseOptions(delimiter=delimiter),
                convert_options=pacsv.ConvertOptions(column_types=_typed_columns(hint)),
            )
        if fmt == "jsonl":
            parse = pajson.ParseOptions(newlines_in_values=False)
            if hint is not None:
                parse = pajson.ParseOptions(explicit_schema=_json_read_schema(hint),
                                            unexpected_field_behavior="infer")
            return pajson.open_json(stream, read_options=pajson.ReadOptions(
                block_size=BLOCK_BYTES), parse_options=parse)
        raise ValidationError(f"Unknown format {fmt!r}: use one of {', '.join(FORMATS)}")

    def __enter__(self) -> FileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                batch = next(self._batches)
            except StopIteration:
                return
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise _read_error(self.path, self.format, exc) from None
            self._rows_read += batch.num_rows
            if self._convert:
                try:
                    batch = self._converted(batch)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise _read_error(self.path, self.format, exc) from None
            yield batch

    def _converted(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        columns = list(batch.columns)
        for i, name in enumerate(batch.schema.names):
            target = self._convert.get(name)
            if target is not None and pa.types.is_string(columns[i].type):
                columns[i] = _from_json_text(columns[i], target)
        return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)

    def position(self) -> int:
        """Bytes of the file consumed so far (estimated from rows for Parquet)."""
        if self._parquet is not None:
            total = self._parquet.metadata.num_rows
            return self.size if not total else int(self.size * self._rows_read / total)
        if self._raw is not None and not self._raw.closed:
            return int(self._raw.tell())
        return self.size


class BatchWriter(Protocol):
    def write(self, batch: pa.RecordBatch) -> None: ...

    def close(self) -> None: ...


class _JsonLinesWriter:
    def __init__(self, path: str) -> None:
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, batch: pa.RecordBatch) -> None:
        self._file.writelines(dumps(row) + "\n" for row in batch.to_pylist())

    def close(self) -> None:
        self._file.close()


def _open_writer(path: str, fmt: str, schema: pa.Schema) -> BatchWriter:
    if fmt == "parquet":
        return pq.ParquetWriter(path, schema)
    if fmt == "csv":
        return pacsv.CSVWriter(path, schema)
    if fmt == "jsonl":
        return _JsonLinesWriter(path)
    raise ValidationError(f"Unknown format {fmt!r}: use one of {', '.join(FORMATS)}")


def write_file(path: str, fmt: str, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> int:
    """Write ``batches`` to ``path``; the file appears only once complete. Returns the row count.

    The data goes to a temporary file next to ``path`` first, so a failed export never leaves a
    truncated file that looks finished.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(2, "No such directory", directory)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    rows = 0
    try:
        writer = _open_writer(tmp, fmt, schema)
        try:
            for batch in batches:
                writer.write(batch)
                rows += batch.num_rows
        finally:
            writer.close()
        os.replace(tmp, path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ValidationError(f"Cannot write {fmt} to {path!r}: {exc}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return rows
