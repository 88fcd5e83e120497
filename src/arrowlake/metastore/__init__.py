"""The SQL metastore (SQLAlchemy Core over SQLite or PostgreSQL)."""

from arrowlake.metastore.store import Metastore, NewFile, TableRecord

__all__ = ["Metastore", "NewFile", "TableRecord"]
