"""Scans: planning (pruning to picklable splits) and reading (splits to Arrow)."""

from arrowlake.scan.scan import Scan
from arrowlake.scan.split import FileTask, Split

__all__ = ["FileTask", "Scan", "Split"]
