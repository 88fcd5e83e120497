"""The maintenance service keeps the Iceberg view of the tables that opt in current.

A table with ``iceberg.publish = true`` gets its Iceberg metadata published
(:func:`arrowlake.iceberg.publish`) whenever the service works on it after it moved (a commit,
an expiry, a new tag or schema), so Iceberg readers that open its current metadata (through
``arrowlake iceberg-rest``, or by path) find the newest snapshot without waiting for a
publication on demand. Other tables are published on demand only.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from arrowlake.iceberg import publish, publish_on_maintain
from arrowlake.maintenance.actions import Action
from arrowlake.table.table import Table


def publish_by_policy(table: Table) -> Action | None:
    """Publish the table's Iceberg metadata if it opted in and something of it changed; the
    action, or None when there was nothing to do. A table that opted in but has no Iceberg
    view raises :class:`~arrowlake.errors.NoIcebergView` (the service reports it)."""
    rec = table._record
    if not publish_on_maintain(rec.properties):
        return None
    started = time.monotonic()
    before = table._metastore.iceberg_current(rec.table_id)
    found = publish(table)
    location = table._storage.relative(rec.location, found.metadata_location)
    if before is not None and before[0] == location:
        return None
    at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return Action(table.name, "iceberg", at, time.monotonic() - started,
                  snapshot_id=found.snapshot_id)
