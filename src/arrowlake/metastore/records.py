"""Plain records the metastore hands out and takes (tables, new files, commits) and the
checks on names and commit ids."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import pyarrow as pa

from arrowlake.errors import (
    CommitConflict,
    InvalidName,
    SnapshotNotFound,
    ValidationError,
)

#: Snapshot ids are the metastore's 64-bit signed integers.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def now_ms() -> int:
    return int(time.time() * 1000)


def epoch_ms(at: object, what: str) -> int:
    """Milliseconds since the epoch of ``at``, the unit commit times are stored in.

    A naive datetime is local time, as :meth:`datetime.timestamp` and ``datetime.now()`` take
    it; an aware one is converted from its zone. Anything else is a :class:`ValidationError`
    naming ``what`` (the argument it came from).
    """
    if not isinstance(at, datetime):
        raise ValidationError(f"{what} must be a datetime, got {type(at).__name__} {at!r}")
    try:
        return int(at.timestamp() * 1000)
    except (OverflowError, OSError, ValueError) as exc:
        raise ValidationError(f"{what} {at!r} is out of the range of commit times: {exc}") \
            from None


def check_snapshot_id(snapshot_id: object) -> int:
    """``snapshot_id`` as an int if it can name a snapshot: an int (not a bool) in the 64-bit
    range the metastore stores; past that range no snapshot exists (:class:`SnapshotNotFound`,
    as for any id never committed), and a value of another type is a
    :class:`ValidationError`."""
    if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
        raise ValidationError(
            f"A snapshot id must be an integer, got {type(snapshot_id).__name__} "
            f"{snapshot_id!r}")
    if not _INT64_MIN <= snapshot_id <= _INT64_MAX:
        raise SnapshotNotFound(
            f"Snapshot {snapshot_id} does not exist: snapshot ids are 64-bit integers")
    return int(snapshot_id)


#: The table property that turns merge-on-write with deletion vectors on.
DELETION_VECTORS_PROPERTY = "deletion-vectors.enabled"
#: Where a table records when its mode was switched: a JSON list of ``[snapshot_id,
#: "true"|"false"]``, one entry per switch, oldest first: the table's last snapshot when it
#: was switched (which both modes read alike) and every later one are read in that mode.
#: Written by the switch only, so time travel reads each snapshot in the mode it was written in.
MODE_SWITCHES_PROPERTY = "deletion-vectors.switches"


def deletion_vectors_on(properties: Mapping[str, str]) -> bool:
    """Whether properties of a primary-key table turn deletion vectors on (its current mode)."""
    return str(properties.get(DELETION_VECTORS_PROPERTY, "false")).strip().lower() == "true"


def mode_switches(properties: Mapping[str, str]) -> list[tuple[int, bool]]:
    """The table's mode switches, oldest first: ``(first snapshot id in it, new mode)``."""
    text = properties.get(MODE_SWITCHES_PROPERTY)
    return [] if not text else [(int(after), value == "true") for after, value in json.loads(text)]


def deletion_vectors_at(properties: Mapping[str, str], snapshot_id: int | None) -> bool:
    """The mode snapshot ``snapshot_id`` was written in (the current one when None)."""
    switches = mode_switches(properties)
    if snapshot_id is None or not switches:
        return deletion_vectors_on(properties)
    mode = not switches[0][1]  # every switch flips the mode
    for after, value in switches:
        if snapshot_id >= after:
            mode = value
    return mode

#: Longest namespace, table or tag name and commit id the metastore columns hold.
MAX_NAME_LENGTH = 255
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def check_name(kind: str, name: object) -> str:
    """``name`` if it fits a name column on every metastore, else :class:`InvalidName`."""
    if (not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH
            or _CONTROL_CHARACTERS.search(name)):
        shown = name if not isinstance(name, str) or len(name) <= 80 else name[:80] + "..."
        raise InvalidName(
            f"Invalid {kind} name {shown!r}: use 1 to {MAX_NAME_LENGTH} characters, none of them "
            "a control character (NUL, newline, tab)")
    return name


def check_commit_id(commit_id: object) -> None:
    """Refuse a commit id no metastore can store (PostgreSQL text cannot hold NUL)."""
    if commit_id is None:
        return
    if (not isinstance(commit_id, str) or not commit_id or len(commit_id) > MAX_NAME_LENGTH
            or "\x00" in commit_id):
        shown = commit_id if not isinstance(commit_id, str) or len(commit_id) <= 80 \
            else commit_id[:80] + "..."
        raise ValidationError(
            f"Invalid commit_id {shown!r}: use a string of 1 to {MAX_NAME_LENGTH} characters "
            "without NUL; nothing was written")


@dataclass(frozen=True)
class TableRecord:
    table_id: int
    namespace: str
    name: str
    location: str
    current_schema_id: int
    current_snapshot_id: int | None
    last_field_id: int
    partition_by: tuple[str, ...]
    primary_key: tuple[str, ...]
    buckets: int | None
    properties: dict[str, str]
    created_at: int

    @property
    def full_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def deletion_vectors(self) -> bool:
        """Whether this primary-key table settles versions on write: each key lives in one
        row of one file, older versions marked deleted in deletion vectors (no merge on read)."""
        return bool(self.primary_key) and deletion_vectors_on(self.properties)

    def as_of(self, snapshot_id: int | None) -> TableRecord:
        """This record as a reader of ``snapshot_id`` needs it: in the mode that snapshot was
        written in, if the table was switched since."""
        if not self.primary_key or deletion_vectors_at(self.properties, snapshot_id) == \
                self.deletion_vectors:
            return self
        mode = "true" if not self.deletion_vectors else "false"
        return replace(self, properties={**self.properties, DELETION_VECTORS_PROPERTY: mode})


@dataclass(frozen=True)
class NewFile:
    """A data file written by a writer, to be recorded by a commit."""

    path: str  # relative to the table location
    schema_id: int
    row_count: int
    file_size: int
    stats: str = "{}"
    partition_path: str | None = None
    partition_values: str | None = None  # JSON, see arrowlake.io.stats
    bucket: int | None = None
    content: str = "data"
    key_min: str | None = None
    key_max: str | None = None
    seq_min: int | None = None
    seq_max: int | None = None


@dataclass(frozen=True)
class NewVector:
    """A data file's new cumulative deletion vector, to be recorded by a commit.

    ``previous`` is the ``added_snapshot`` of the vector it extends (None when the file had
    none): the commit records it only while that one is still the file's current vector, so
    two writers extending the same vector never lose each other's positions
    (:class:`StaleVectors` sends the later one back to extend the newer vector)."""

    file_id: int
    cardinality: int
    new_positions: int  # positions this commit deletes (cardinality minus the previous one's)
    previous: int | None = None
    blob: bytes | None = None  # inline deletion-vector-v1 bytes ...
    puffin_path: str | None = None  # ... or where a Puffin file holds them
    blob_offset: int | None = None
    blob_length: int | None = None


class StaleVectors(CommitConflict):
    """A commit's deletion vectors extend vectors that another commit replaced meanwhile, or
    mark rows of files another commit removed: the writer looks its keys up again on the
    newer snapshot and retries (users see it only if that keeps failing)."""

    def __init__(self, message: str, file_ids: Sequence[int]) -> None:
        super().__init__(message)
        self.file_ids = list(file_ids)


class TableConflict(CommitConflict):
    """One table's change of a lake transaction could not be committed: ``cause`` (a
    :class:`CommitConflict`, perhaps :class:`StaleVectors`) is why; ``table_id`` names the
    table. Nothing of the transaction was committed."""

    def __init__(self, table_id: int, cause: CommitConflict) -> None:
        super().__init__(str(cause))
        self.table_id = table_id
        self.cause = cause


@dataclass(frozen=True)
class VectorRecord:
    """A data file's deletion vector as the metastore records it for a snapshot."""

    file_id: int
    added_snapshot: int
    cardinality: int
    blob: bytes | None
    puffin_path: str | None
    blob_offset: int | None
    blob_length: int | None


def vector_bytes(records: Iterable[VectorRecord]) -> int:
    """What deletion vector records weigh in memory, roughly (for the snapshot cache)."""
    return sum(64 + len(v.blob or b"") + len(v.puffin_path or "") for v in records)


@dataclass(frozen=True)
class CommitResult:
    snapshot_id: int | None
    attempts: int = 1
    duplicate: bool = False  # a snapshot with the same commit id existed already


@dataclass(frozen=True)
class SnapshotChange:
    """What one commit does, described as data (so it can be retried on a new base)."""

    kind: str
    schema_id: int
    add: Sequence[NewFile] = ()
    remove: Sequence[int] = ()  # file ids
    removed_rows: int = 0
    commit_id: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    # Called inside the transaction when other commits landed after ``base``; gets the files they
    # added and raises CommitConflict if this change can no longer be applied on top of them.
    on_rebase: Callable[[pa.Table], None] | None = None
    # Changelog files of primary-key tables (changelog producers ``input`` and ``lookup``):
    # recorded with content ``changelog`` and read by this snapshot only, so they are never
    # part of a table's live files and expire with the snapshot that wrote them.
    changelog: Sequence[NewFile] = ()
    # Deletion vectors (merge-on-write primary-key tables): each replaces its file's current
    # vector; the positions they add count as removed rows of the snapshot.
    vectors: Sequence[NewVector] = ()
    # Tombstone files (merge-on-write tables with a sequence field): the keys a write deleted,
    # with their sequence values, so a version arriving later with an older sequence value
    # stays deleted. Recorded with content ``tombstone``: live like data files, never scanned.
    tombstones: Sequence[NewFile] = ()
    # Tombstone files (file ids) this change ends: an overwrite of a merge-on-write table
    # forgets the deletes of the rows it replaces, as merge-on-read forgets their retractions.
    remove_tombstones: Sequence[int] = ()
    # A rewrite of files of a merge-on-write table (compaction) read them with these vectors
    # (file id -> the snapshot that recorded the vector, None: none): if another commit
    # extended one meanwhile, the rewrite would bring rows back, so it is StaleVectors.
    expect_vectors: Mapping[int, int | None] = field(default_factory=dict)
    # The mode of the primary-key table the change was planned in (True: deletion vectors,
    # False: merge-on-read runs; None: any, as for tables without a key): if the table's mode
    # was switched meanwhile, the commit is a CommitConflict, never a snapshot of one mode in
    # a table of the other.
    deletion_vectors: bool | None = None
    # The registrations of the writes in flight that wrote the change's files (see
    # metastore/inflight.py), besides the one current in the committing context. The commit
    # fails if one was revoked, since orphan removal may then have deleted its files.
    write_ids: tuple[str, ...] = ()
    # The lake transaction this change commits in, recorded with the snapshot.
    transaction_id: str | None = None


@dataclass(frozen=True)
class PartitionIds:
    """A table's partition ids, found for a written file by its directory path or by its values.

    A partition is its values; the path is where its files go, and the path of some values
    changed since tables were first written (a null was ``__NULL__``, long values were not
    hashed). So a path no partition has joins an older partition holding the same values (one
    key of a primary-key table never lives in two partitions), and a path whose partition holds
    a null where the file's values hold a value (the string ``"__NULL__"`` at an old null's
    ``p=__NULL__``) is not that partition. The commit resolves paths the same way, and records
    such a partition under :func:`partition_alias` of the path.
    """

    by_path: dict[str, tuple[int, str]]  # path -> (id, values)
    by_values: dict[str, int]

    @classmethod
    def of(cls, rows: Sequence[tuple[int, str, str]]) -> PartitionIds:
        """From ``(partition_id, path, values)`` rows (the oldest of equal values wins)."""
        by_values: dict[str, int] = {}
        for pid, _, values in sorted(rows):
            by_values.setdefault(values, pid)
        return cls({path: (pid, values) for pid, path, values in rows}, by_values)

    def get(self, path: str | None, values: str | None) -> int | None:
        if path is None:
            return None
        at_path = self.by_path.get(path)
        if at_path is not None and (values is None or same_nulls(at_path[1], values)):
            return at_path[0]
        return self.by_values.get(values) if values is not None else None


def same_nulls(values: str, other: str) -> bool:
    """Whether two partitions' values (JSON lists) hold nulls at the same places."""
    a, b = json.loads(values), json.loads(other)
    return len(a) == len(b) and all((x is None) == (y is None) for x, y in zip(a, b, strict=True))


def partition_alias(path: str, values: str) -> str:
    """The path recorded for a partition whose directory an older partition of other values
    has: the path and a hash of the values in parentheses (never in a quoted path)."""
    return f"{path}({hashlib.sha256(values.encode()).hexdigest()[:16]})"


FILE_COLUMNS = (
    "file_id", "path", "partition_id", "bucket", "added_snapshot", "removed_snapshot",
    "schema_id", "row_count", "file_size", "content", "stats", "key_min", "key_max",
    "seq_min", "seq_max",
)
_FILE_TYPES = {
    "file_id": pa.int64(), "path": pa.string(), "partition_id": pa.int64(),
    "bucket": pa.int32(), "added_snapshot": pa.int64(), "removed_snapshot": pa.int64(),
    "schema_id": pa.int32(), "row_count": pa.int64(), "file_size": pa.int64(),
    "content": pa.string(), "stats": pa.string(), "key_min": pa.string(),
    "key_max": pa.string(), "seq_min": pa.int64(), "seq_max": pa.int64(),
}
FILE_SCHEMA = pa.schema([(c, _FILE_TYPES[c]) for c in FILE_COLUMNS])


def rows_to_table(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.Table:
    # Transposing with zip keeps the per-row work inside the interpreter's C code.
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.table([pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)],
                    schema=schema)
