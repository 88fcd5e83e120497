"""A table's maintenance policy: who compacts it, and what housekeeping may remove.

``compaction.mode`` says who compacts a primary-key table: ``inline`` (each write compacts the
buckets it touched that became due, within its budget), ``deferred`` (writes never compact; a
maintenance service, ``arrowlake maintain`` or ``Lake.maintain()``, does) or ``off`` (nothing
compacts on its own; ``table.compact()`` still does). ``snapshot.retain-last``,
``snapshot.max-age`` and ``orphan.min-age`` say what the service may expire and delete. Every
property is checked when it is set, so a malformed value fails then, never in the service.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from arrowlake.errors import UnsafeOrphanAge, ValidationError
from arrowlake.units import parse_duration_seconds


def parse_duration(name: str, text: str) -> float:
    """A table property holding a duration (see :mod:`arrowlake.units`: ``"3600"`` seconds,
    ``"30 min"``, ``"7 d"``, ``"1h30m"``), in seconds."""
    try:
        return parse_duration_seconds(text)
    except ValueError as exc:
        raise ValidationError(f"Table property {name} = {text!r}: {exc}") from None


#: Ages below this are unsafe for files no registration claims: files of tools that do not
#: register their writes (older arrowlake versions, copies made by hand), clocks that disagree
#: between the writer, the object store and this process, and listings that lag behind.
SAFE_ORPHAN_AGE = timedelta(hours=1)


def warn_unsafe_orphan_age(older_than: timedelta, where: str) -> None:
    """Warn (:class:`UnsafeOrphanAge`) about an orphan age below :data:`SAFE_ORPHAN_AGE`."""
    if older_than < SAFE_ORPHAN_AGE:
        warnings.warn(UnsafeOrphanAge(
            f"{where} of {older_than} is below {SAFE_ORPHAN_AGE}: arrowlake's own writes in "
            "flight stay safe (they are registered in the metastore and their files are never "
            "taken), but unreferenced files that a tool writing without registration is still "
            "writing, or whose times a skewed clock misstates, can be deleted"), stacklevel=3)


COMPACTION_MODE = "compaction.mode"
COMPACTION_MODES = ("inline", "deferred", "off")
#: The mode of a table without the property (every table created before it existed).
DEFAULT_COMPACTION_MODE = "inline"
#: The mode ``Lake.create_table`` gives a new primary-key table that names none; it is stored
#: as the table's property unless it is the default above. See the README, "Maintenance".
NEW_TABLE_COMPACTION_MODE = "inline"

RETAIN_LAST = "snapshot.retain-last"
#: Snapshot ids are 64-bit: a table never has more snapshots than this.
MAX_RETAIN_LAST = 2**63 - 1
MAX_AGE = "snapshot.max-age"
ORPHAN_MIN_AGE = "orphan.min-age"
#: How old an unreferenced file must be before the service deletes it, unless the table says:
#: a write in progress has written files it has not committed yet.
DEFAULT_ORPHAN_MIN_AGE = 86400.0


def compaction_mode(props: Mapping[str, str]) -> str:
    """``inline``, ``deferred`` or ``off``; a bad value raises ValidationError naming the
    property and the allowed values."""
    value = props.get(COMPACTION_MODE)
    if value is None or value == "":
        return DEFAULT_COMPACTION_MODE
    mode = str(value).strip().lower()
    if mode not in COMPACTION_MODES:
        raise ValidationError(
            f"Table property '{COMPACTION_MODE}' must be one of {', '.join(COMPACTION_MODES)} "
            f"(inline: each write compacts; deferred: a maintenance service compacts; off: "
            f"only compact() does), not {value!r}")
    return mode


@dataclass(frozen=True)
class MaintenancePolicy:
    """What the maintenance service does to one table."""

    compaction_mode: str
    #: Keep at least this many newest snapshots (None: expire none by count).
    retain_last: int | None
    #: Expire snapshots older than this many seconds (None: expire none by age).
    max_age: float | None
    #: Delete unreferenced files older than this many seconds.
    orphan_min_age: float

    @property
    def expires(self) -> bool:
        """Whether the service expires snapshots of the table at all: only when the table
        names a policy (a table without one keeps its whole history, as it always did)."""
        return self.retain_last is not None or self.max_age is not None


def warn_unsafe_properties(given: Mapping[str, str]) -> None:
    """When ``orphan.min-age`` is set below the safe age, warn (once, where it is set)."""
    text = given.get(ORPHAN_MIN_AGE)
    if text:
        warn_unsafe_orphan_age(timedelta(seconds=parse_duration(ORPHAN_MIN_AGE, text)),
                               f"Table property '{ORPHAN_MIN_AGE}' = {text!r}")


def maintenance_policy(props: Mapping[str, str]) -> MaintenancePolicy:
    """The table's policy from its properties (ValidationError naming a malformed one)."""
    retain: int | None = None
    text = props.get(RETAIN_LAST)
    if text is not None and text != "":
        try:
            retain = int(text)
        except ValueError:
            retain = 0
        if not 1 <= retain <= MAX_RETAIN_LAST:
            raise ValidationError(
                f"Table property '{RETAIN_LAST}' must be a whole number from 1 to "
                f"{MAX_RETAIN_LAST} (the newest snapshots the maintenance service always "
                f"keeps), not {text!r}")
    max_age = props.get(MAX_AGE)
    orphan = props.get(ORPHAN_MIN_AGE)
    return MaintenancePolicy(
        compaction_mode=compaction_mode(props),
        retain_last=retain,
        max_age=parse_duration(MAX_AGE, max_age) if max_age else None,
        orphan_min_age=parse_duration(ORPHAN_MIN_AGE, orphan) if orphan
        else DEFAULT_ORPHAN_MIN_AGE)
