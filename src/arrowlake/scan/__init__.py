"""Scans: planning (pruning to picklable splits) and reading (splits to Arrow).

``Scan`` (and with it the planning, which needs the metastore) is imported on first use: a
process that only reads splits imports :mod:`arrowlake.scan.split` and the read path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arrowlake.lazy import lazy_exports
from arrowlake.scan.split import FileTask, Split

if TYPE_CHECKING:
    from arrowlake.scan.scan import Scan

__getattr__, __dir__ = lazy_exports(__name__, {"Scan": "arrowlake.scan.scan"})

__all__ = ["FileTask", "Scan", "Split"]
