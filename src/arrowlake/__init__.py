"""arrowlake: lakehouse tables of Parquet files with a SQL metastore.

>>> import arrowlake as al
>>> import pyarrow as pa
>>> lake = al.connect("/tmp/doctest-lake-init")
>>> t = lake.create_table("demo.t", pa.schema([("x", pa.int64())]), exist_ok=True)

``import arrowlake`` imports none of its modules: each public name is imported from its module
on first use (a Spark executor that only reads splits never loads the SQL metastore).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arrowlake.lazy import lazy_exports

if TYPE_CHECKING:
    from arrowlake import dask, torch
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
    from arrowlake.maintenance import MaintenanceAction
    from arrowlake.scan.scan import Scan
    from arrowlake.streaming import Change, Stream
    from arrowlake.table.maintenance.health import TableHealth
    from arrowlake.table.table import Table
    from arrowlake.table.transaction import LakeSnapshot, Pending, Transaction
    from arrowlake.table.writes.commit import WriteResult

__version__ = "0.1.0"

#: Each public name and the module it is imported from on first use.
_EXPORTS = {
    "ArrowlakeError": "arrowlake.errors",
    "Change": "arrowlake.streaming",
    "ColumnNotFound": "arrowlake.errors",
    "CommitConflict": "arrowlake.errors",
    "FilterSyntaxError": "arrowlake.errors",
    "Lake": "arrowlake.lake",
    "MaintenanceAction": "arrowlake.maintenance",
    "Scan": "arrowlake.scan.scan",
    "SchemaMismatch": "arrowlake.errors",
    "Stream": "arrowlake.streaming",
    "Table": "arrowlake.table.table",
    "TableHealth": "arrowlake.table.maintenance.health",
    "TableNotFound": "arrowlake.errors",
    "ValidationError": "arrowlake.errors",
    "WriteResult": "arrowlake.table.writes.commit",
    "Transaction": "arrowlake.table.transaction",
    "LakeSnapshot": "arrowlake.table.transaction",
    "Pending": "arrowlake.table.transaction",
    "col": "arrowlake.expressions",
    "connect": "arrowlake.lake",
    "dask": "arrowlake.dask",
    "lit": "arrowlake.expressions",
    "parse_filter": "arrowlake.expressions",
    "torch": "arrowlake.torch",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ArrowlakeError",
    "Change",
    "ColumnNotFound",
    "CommitConflict",
    "FilterSyntaxError",
    "Lake",
    "LakeSnapshot",
    "MaintenanceAction",
    "Pending",
    "Scan",
    "SchemaMismatch",
    "Stream",
    "Table",
    "TableHealth",
    "TableNotFound",
    "Transaction",
    "ValidationError",
    "WriteResult",
    "col",
    "connect",
    "dask",
    "lit",
    "parse_filter",
    "torch",
]
