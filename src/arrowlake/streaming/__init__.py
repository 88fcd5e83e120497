"""Change streams over tables: ``Table.stream()`` (see :mod:`arrowlake.streaming.stream`).

Importing :mod:`arrowlake.streaming.stream` installs ``Table.stream``'s implementation
(:mod:`arrowlake.lake` does). ``Change`` and ``Stream`` are imported on first use: a process
that only reads change splits imports :mod:`arrowlake.streaming.splits` and the read path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arrowlake.lazy import lazy_exports
from arrowlake.streaming.splits import ROW_KIND_COLUMN, ChangeSplit

if TYPE_CHECKING:
    from arrowlake.streaming.change import Change
    from arrowlake.streaming.stream import Stream

__getattr__, __dir__ = lazy_exports(__name__, {
    "Change": "arrowlake.streaming.change",
    "Stream": "arrowlake.streaming.stream",
})

__all__ = ["ROW_KIND_COLUMN", "Change", "ChangeSplit", "Stream"]
