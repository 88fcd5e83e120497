"""Change streams over tables: ``Table.stream()`` (see :mod:`arrowlake.streaming.stream`).

Importing this package installs ``Table.stream``'s implementation (``import arrowlake`` does).
"""

from arrowlake.streaming.change import ROW_KIND_COLUMN, Change, ChangeSplit
from arrowlake.streaming.stream import Stream

__all__ = ["ROW_KIND_COLUMN", "Change", "ChangeSplit", "Stream"]
