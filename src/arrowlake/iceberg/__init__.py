"""Every table Iceberg v3 can describe is also an Iceberg table: its metadata, published.

The SQL metastore stays the source of truth; Iceberg metadata (metadata JSON, manifest lists,
manifests, deletion vectors in Puffin files) is a view of it, written on demand (``publish``,
:meth:`Table.iceberg_metadata_location`, ``arrowlake iceberg TABLE``, a load through the REST
catalog) or kept current by ``arrowlake maintain`` for tables with the property
``iceberg.publish = true``; never on the write path. Spark, Trino, Flink, DuckDB and pyiceberg
then read the tables with their own Iceberg readers.

>>> import arrowlake.iceberg
>>> publication = arrowlake.iceberg.publish(users)           # doctest: +SKIP
>>> publication.metadata_location                            # doctest: +SKIP
'/lake/crm/users-1a2b3c4d/metadata/...metadata.json'

See :mod:`arrowlake.iceberg.publisher` (what is written, incrementally), :mod:`.view` (which
tables and snapshots have a view), :mod:`.types` (the type mapping) and :mod:`.metadata`.
"""

from __future__ import annotations

from arrowlake.errors import NoIcebergView
from arrowlake.iceberg.publisher import (
    PUBLISH_PROPERTY,
    Publication,
    publish,
    publish_on_maintain,
    published,
    view_status,
)
from arrowlake.table import table as _table


def _metadata_location(table: _table.Table, snapshot: int | None) -> str:
    return publish(table, snapshot).metadata_location


_table.register_iceberg_publisher(_metadata_location)
_table.register_iceberg_status(view_status)

__all__ = ["PUBLISH_PROPERTY", "NoIcebergView", "Publication", "publish",
           "publish_on_maintain", "published", "view_status"]
