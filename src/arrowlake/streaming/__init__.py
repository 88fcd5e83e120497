"""Change streams over tables: ``Table.stream()`` (see :mod:`arrowlake.streaming.stream`).

Importing this package installs ``Table.stream``'s implementation (``import arrowlake`` does).
"""

from arrowlake.streaming.change import Change
from arrowlake.streaming.splits import ROW_KIND_COLUMN, ChangeSplit
from arrowlake.streaming.stream import Stream

__all__ = ["ROW_KIND_COLUMN", "Change", "ChangeSplit", "Stream"]
