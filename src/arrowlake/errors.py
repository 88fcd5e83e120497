"""The one exception hierarchy of arrowlake.

Every error a user can cause is an :class:`ArrowlakeError`; its message says what was wrong,
where, and what to do about it. Errors about bad input also subclass :class:`ValueError`, lookups
of missing things also subclass :class:`LookupError`, so generic handlers keep working.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ArrowlakeError(Exception):
    """Base class of every error arrowlake raises on purpose."""

    #: The gRPC status ``arrowlake serve`` answers this error with (the README's Flight section
    #: lists them). Only codes that pyarrow's Flight server can send are used: it cannot send
    #: ABORTED, FAILED_PRECONDITION or ALREADY_EXISTS from Python.
    grpc_status: ClassVar[str] = "UNKNOWN"


class ValidationError(ArrowlakeError, ValueError):
    """The input was not acceptable; nothing was written."""

    grpc_status = "INVALID_ARGUMENT"


class InvalidName(ValidationError):
    """A namespace, table, tag or column name is not allowed."""


class SchemaMismatch(ValidationError):
    """Data or a schema change does not fit the table's schema."""


class ColumnNotFound(ValidationError):
    """A column named in a filter, projection or option does not exist."""


class FilterSyntaxError(ValidationError):
    """A filter string could not be parsed.

    ``text`` is the whole filter and ``position`` the 0-based offset of the offending token.
    """

    def __init__(self, message: str, text: str = "", position: int = 0) -> None:
        self.text = text
        self.position = position
        if text:
            pointer = " " * position + "^"
            message = f"{message}\n  {text}\n  {pointer}"
        super().__init__(message)


class NotFound(ArrowlakeError, LookupError):
    """Something that was asked for does not exist."""

    grpc_status = "NOT_FOUND"

    def __str__(self) -> str:  # LookupError would quote the message like a dict key
        return str(self.args[0]) if self.args else ""


class NamespaceNotFound(NotFound):
    pass


class TableNotFound(NotFound):
    pass


class SnapshotNotFound(NotFound):
    pass


class TagNotFound(NotFound):
    pass


class AlreadyExists(ArrowlakeError):
    """Something to be created exists already."""

    # ALREADY_EXISTS cannot be sent by pyarrow's server (no Flight call creates anything)
    grpc_status = "UNKNOWN"


class TableAlreadyExists(AlreadyExists):
    pass


class CommitConflict(ArrowlakeError):
    """A commit lost a race that cannot be resolved by retrying; the table is unchanged."""

    # gRPC's ABORTED is not in Flight's codes (C++ and Java clients turn it into INTERNAL or
    # UNAVAILABLE): UNAVAILABLE says what to do, send the write again later.
    grpc_status = "UNAVAILABLE"


class ConsumerInUse(ArrowlakeError):
    """Another open stream holds the consumer id (its lease has not expired)."""

    grpc_status = "UNAVAILABLE"


class ModeSwitched(ArrowlakeError):
    """A stream reached snapshots written in another mode (deletion vectors or merge on read)
    than the one it reads the table in: the table's mode was switched."""

    grpc_status = "UNKNOWN"


class MetastoreError(ArrowlakeError):
    """The metastore database is unusable (wrong version, corrupt rows)."""

    grpc_status = "INTERNAL"


class StorageError(ArrowlakeError, OSError):
    """An object or file could not be read or written after retries."""

    grpc_status = "UNAVAILABLE"  # after retries, but storage outages pass


class ReadOnlyLake(ArrowlakeError, PermissionError):
    """The lake (its metastore or its folder) can be read but not written."""

    grpc_status = "PERMISSION_DENIED"


class DataFileError(StorageError):
    """A data file that the metastore lists is missing, truncated or not valid Parquet."""

    grpc_status = "INTERNAL"  # gRPC's DATA_LOSS, which Flight clients read as INTERNAL


class NoIcebergView(ArrowlakeError):
    """The table (or the snapshot asked for) cannot be published as Iceberg metadata: a
    merge-on-read primary-key table, or a column of a type Iceberg lacks. The message says
    why, and how to change that where it can be changed."""


class MissingDependency(ArrowlakeError, ImportError):
    """An optional dependency is needed for this call; the message names the extra to install."""

    grpc_status = "UNIMPLEMENTED"


def require(module: str, extra: str, feature: str) -> Any:
    """Import an optional module, or raise :class:`MissingDependency` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            f"{feature} needs the '{module}' package: pip install 'arrowlake[{extra}]'"
        ) from exc


class ArrowlakeWarning(UserWarning):
    """Base class of arrowlake's warnings."""


class UnsafeOrphanAge(ArrowlakeWarning):
    """An orphan age (``older_than``, ``orphan.min-age``) too small to be safe for files that
    no registered write claims (see ``Table.remove_orphan_files``)."""
