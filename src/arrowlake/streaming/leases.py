"""Consumer leases: an open stream's hold on its consumer id, so that two live streams never
share one (the second gets ``ConsumerInUse``). A holder on this machine counts as alive while
its process exists; one on another machine until its lease expires unless renewed. The rows
live in the metastore (``al_consumer_leases``)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from typing import Any

from arrowlake.metastore.store import Metastore
from arrowlake.metastore.streams import LeaseHolder

#: How long a consumer's lease lasts unless renewed; an open stream renews it at a poll or
#: commit once a quarter of it has passed, and waits at most that long between polls.
LEASE_SECONDS = 60.0


def _where_this_runs() -> str:
    """The machine and PID namespace this process runs in: where its process id means it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return socket.gethostname()[:255]
    return f"{socket.gethostname()[:150]} (boot {boot}, {namespace})"


_HOST = _where_this_runs()
#: Where this process runs, as lease rows record it (the maintenance service's leases too).
HOST = _HOST


def _holder_alive(lease: Any) -> bool | None:
    """Whether the stream holding a lease row is alive: False when its process is known to be
    gone, None when that cannot be told from here (another machine: its lease's expiry
    decides)."""
    if lease.host != _HOST:
        return None
    if lease.pid == os.getpid():
        return True  # another open stream of this process
    try:
        os.kill(int(lease.pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists (another user's process)
    return True


#: Whether a lease row's holder is alive (True/False), or cannot be told from here (None).
holder_alive = _holder_alive


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
                                              self.ms, _holder_alive)
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
