"""Table maintenance as a service: compaction off the write path, snapshot expiry and orphan
removal by each table's policy (``arrowlake maintain``, ``Lake.maintain()``)."""

from arrowlake.maintenance.actions import Action, ByteBudget
from arrowlake.maintenance.service import Maintainer

#: ``arrowlake.MaintenanceAction``: what the service reports for each action.
MaintenanceAction = Action

__all__ = ["Action", "ByteBudget", "Maintainer", "MaintenanceAction"]
