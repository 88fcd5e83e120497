"""The Iceberg v3 table metadata JSON of a table as of one snapshot.

Everything in it is derived from the metastore, and nothing from the moment it is written
(``last-updated-ms`` is the newest of the times it describes), so the same state always gives
the same JSON: a publisher recognizes a view it wrote before by the hash of its content.

- ``snapshots``: the retained snapshots with a view, up to the one described; ids and sequence
  numbers are arrowlake's snapshot ids (per table, only growing), times its commit times, and
  ``first-row-id``/``added-rows`` its row lineage.
- ``snapshot-log``: the snapshots of the unbroken chain of parents ending at the one described,
  for time travel by timestamp: a time before the chain's first snapshot finds none, as in
  arrowlake, rather than an older snapshot that was no longer current then.
- ``schemas``: every schema version up to the current one that Iceberg can describe.
- ``refs``: ``main`` and a tag per arrowlake tag (a tag called ``main`` is left out).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from arrowlake.iceberg.manifests import PartitionSpec
from arrowlake.iceberg.types import max_field_id
from arrowlake.metastore.records import TableRecord

#: The namespace of the table uuids: a table's uuid is derived from what identifies it.
_UUID_NAMESPACE = uuid.UUID("8a3b5c1e-6f0d-4d8e-9a51-0b1e7c4f2a93")


def table_uuid(rec: TableRecord) -> str:
    """A stable uuid for the table (the same in every publication; another for a table
    created again under the same name)."""
    return str(uuid.uuid5(_UUID_NAMESPACE, f"{rec.location}#{rec.table_id}#{rec.created_at}"))


def operation(snapshot: Mapping[str, Any]) -> str:
    """Iceberg's operation of a snapshot: ``replace`` for compactions (no logical change),
    ``append`` when it only added rows, ``delete`` when it only removed some, else
    ``overwrite``."""
    if snapshot["kind"] == "compact":
        return "replace"
    removed = snapshot["removed_files"] or snapshot["removed_rows"]
    if not removed:
        return "append"
    return "delete" if not snapshot["added_files"] else "overwrite"


def snapshot_json(snapshot: Mapping[str, Any], manifest_list: str) -> dict[str, Any]:
    sid = int(snapshot["snapshot_id"])
    out: dict[str, Any] = {"snapshot-id": sid, "sequence-number": sid,
                           "timestamp-ms": int(snapshot["committed_at"]),
                           "manifest-list": manifest_list,
                           "summary": {"operation": operation(snapshot),
                                       "added-data-files": str(snapshot["added_files"]),
                                       "deleted-data-files": str(snapshot["removed_files"]),
                                       "added-records": str(snapshot["added_rows"]),
                                       "total-data-files": str(snapshot["total_files"]),
                                       "arrowlake.kind": str(snapshot["kind"])},
                           "schema-id": int(snapshot["schema_id"]),
                           "first-row-id": int(snapshot["first_row_id"] or 0),
                           "added-rows": int(snapshot["added_rows"])}
    if snapshot["parent_id"] is not None:
        out["parent-snapshot-id"] = int(snapshot["parent_id"])
    return out


def snapshot_log(listed: Sequence[Mapping[str, Any]]) -> list[dict[str, int]]:
    """The chain of parents ending at the last of ``listed``, as far as it is unbroken."""
    if not listed:
        return []
    by_id = {int(s["snapshot_id"]): s for s in listed}
    chain = [listed[-1]]
    while chain[-1]["parent_id"] is not None and int(chain[-1]["parent_id"]) in by_id:
        chain.append(by_id[int(chain[-1]["parent_id"])])
    return [{"timestamp-ms": int(s["committed_at"]), "snapshot-id": int(s["snapshot_id"])}
            for s in reversed(chain)]


def table_metadata(rec: TableRecord, location: str, *, listed: Sequence[Mapping[str, Any]],
                   manifest_lists: Mapping[int, str], schemas: Mapping[int, dict[str, Any]],
                   schema_times: Mapping[int, int], current_schema_id: int,
                   spec: PartitionSpec, tags: Sequence[tuple[str, int, int]],
                   next_row_id: int, last_column_id: int) -> dict[str, Any]:
    """The metadata JSON (as a dict) describing the last of ``listed`` as current (none: an
    empty table). ``schemas``: Iceberg schemas by id, those up to ``current_schema_id``
    listed."""
    ids = {int(s["snapshot_id"]) for s in listed}
    current = int(listed[-1]["snapshot_id"]) if listed else None
    shown = {i: s for i, s in sorted(schemas.items()) if i <= current_schema_id}
    refs: dict[str, dict[str, Any]] = {}
    times = [schema_times.get(i, 0) for i in shown]
    if current is not None:
        refs["main"] = {"snapshot-id": current, "type": "branch"}
        times.append(int(listed[-1]["committed_at"]))
    for name, snapshot, created in tags:
        if name != "main" and snapshot in ids:
            refs[name] = {"snapshot-id": snapshot, "type": "tag"}
            times.append(created)
    spec_fields = spec.json_fields()
    return {
        "format-version": 3,
        "table-uuid": table_uuid(rec),
        "location": location,
        "last-sequence-number": current or 0,
        "last-updated-ms": max(times, default=rec.created_at),
        "last-column-id": max([last_column_id, *(max_field_id(s) for s in shown.values())]),
        "current-schema-id": current_schema_id,
        "schemas": list(shown.values()),
        "default-spec-id": 0,
        "partition-specs": [{"spec-id": 0, "fields": spec_fields}],
        "last-partition-id": max((f["field-id"] for f in spec_fields), default=999),
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": {},
        "current-snapshot-id": current,
        "refs": refs,
        "snapshots": [snapshot_json(s, manifest_lists[int(s["snapshot_id"])]) for s in listed],
        "snapshot-log": snapshot_log(listed),
        "metadata-log": [],
        "next-row-id": next_row_id,
    }


def content_hash(metadata: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(metadata, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()
