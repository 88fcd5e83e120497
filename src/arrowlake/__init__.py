"""arrowlake: lakehouse tables of Parquet files with a SQL metastore.

>>> import arrowlake as al
>>> import pyarrow as pa
>>> lake = al.connect("/tmp/doctest-lake-init")
>>> t = lake.create_table("demo.t", pa.schema([("x", pa.int64())]), exist_ok=True)
"""

from arrowlake import dask, torch  # register Scan.to_dask() / to_torch(); import nothing optional
from arrowlake.errors import (
    ArrowlakeError,
    ColumnNotFound,
    CommitConflict,
    FilterSyntaxError,
    SchemaMismatch,
    TableNotFound,
    ValidationError,
)
from arrowlake.expressions import col, lit, parse_filter
from arrowlake.lake import Lake, connect
from arrowlake.scan.scan import Scan
from arrowlake.streaming import Change, Stream
from arrowlake.table.table import Table
from arrowlake.table.writes import WriteResult

__version__ = "0.1.0"

__all__ = [
    "ArrowlakeError",
    "Change",
    "ColumnNotFound",
    "CommitConflict",
    "FilterSyntaxError",
    "Lake",
    "Scan",
    "SchemaMismatch",
    "Stream",
    "Table",
    "TableNotFound",
    "ValidationError",
    "WriteResult",
    "col",
    "connect",
    "dask",
    "lit",
    "parse_filter",
    "torch",
]
