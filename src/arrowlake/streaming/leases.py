"""Consumer leases: an open stream's hold on its consumer id, so that two live streams never
share one (the second gets ``ConsumerInUse``). A holder on this machine counts as alive while
its process exists; one on another machine until its lease expires unless renewed. The rows
live in the metastore (``al_consumer_leases``)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid

from arrowlake.metastore.holders import HOST, holder_alive
from arrowlake.metastore.store import Metastore
from arrowlake.metastore.streams import LeaseHolder

#: How long a consumer's lease lasts unless renewed; an open stream renews it at a poll or
#: commit once a quarter of it has passed, and waits at most that long between polls.
LEASE_SECONDS = 60.0


_HOST = HOST  # recorded in this process's leases (tests pose as another machine by changing it)


class Lease:
    """An open stream's hold on its consumer id (see the module docs). Only the process that
    took it renews or releases it: forked copies of the stream (DataLoader workers) do not."""

    def __init__(self, metastore: Metastore, table_id: int, consumer: str) -> None:
        self.metastore, self.table_id, self.consumer = metastore, table_id, consumer
        self.holder = LeaseHolder(uuid.uuid4().hex, _HOST, os.getpid())
        self.held = False
        self.renewed = 0.0
        self.take()

    @property
    def ms(self) -> int:
        return int(LEASE_SECONDS * 1000)

    def _mine(self) -> bool:
        return os.getpid() == self.holder.pid

    def take(self) -> None:
        """Hold the consumer id (ConsumerInUse while another open stream holds it)."""
        self.metastore.acquire_consumer_lease(self.table_id, self.consumer, self.holder,
                                              self.ms, holder_alive)
        self.held, self.renewed = True, time.monotonic()

    def keep(self) -> None:
        """Before a poll: take the id again if it was given up, renew it when due."""
        if not self._mine():
            return
        if not self.held:
            self.take()
        elif time.monotonic() - self.renewed >= LEASE_SECONDS / 4:
            self.metastore.renew_consumer_lease(self.table_id, self.consumer, self.holder,
                                                self.ms)
            self.renewed = time.monotonic()

    def commit(self, next_snapshot: int) -> None:
        """Record progress (refused once another stream holds the consumer id), renewing the
        lease while held."""
        renew = self.held and self._mine()
        self.metastore.commit_consumer(self.table_id, self.consumer, next_snapshot,
                                       holder=self.holder, lease_ms=self.ms if renew else None)
        if renew:
            self.renewed = time.monotonic()

    def release(self) -> None:
        if not (self.held and self._mine()):
            return
        self.held = False
        # At interpreter exit or after a dropped table, there may be nothing to release
        # (the lease then expires, or its process is seen to be gone).
        with contextlib.suppress(Exception):
            self.metastore.release_consumer_lease(self.table_id, self.consumer, self.holder)
