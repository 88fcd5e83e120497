"""An Iceberg REST catalog over a lake: ``arrowlake iceberg-rest``.

Spark, Trino, Flink, DuckDB and pyiceberg attach with one URI and read every table that has an
Iceberg view through their own Iceberg readers; the metadata is published on demand by
:mod:`arrowlake.iceberg`. The catalog is read-only: writes are refused with a message saying
how to write. Needs the ``iceberg-rest`` extra (Starlette and uvicorn).

    arrowlake --lake ./lake iceberg-rest --port 8181 --token-file tokens.txt
"""

from __future__ import annotations

from arrowlake.iceberg_rest.app import build_app
from arrowlake.iceberg_rest.catalog import CatalogSettings, s3_table_config
from arrowlake.iceberg_rest.server import DEFAULT_PORT, RunningCatalog, serve

__all__ = ["DEFAULT_PORT", "CatalogSettings", "RunningCatalog", "build_app", "s3_table_config",
           "serve"]
