"""Who holds a row of the metastore that must be let go when its holder dies: consumer leases,
the maintenance service's bucket leases and in-flight writes.

A holder is recorded with the machine and PID namespace it runs in (``HOST``) and its process
id. On the same machine and namespace, whether it is alive can be told at once; elsewhere only
its lease's expiry tells.
"""

from __future__ import annotations

import os
import socket
from typing import Any


def where_this_runs() -> str:
    """The machine and PID namespace this process runs in: where its process id means it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return socket.gethostname()[:255]
    return f"{socket.gethostname()[:150]} (boot {boot}, {namespace})"


#: Where this process runs, as lease and write rows record it.
HOST = where_this_runs()


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits only to be reaped by its parent. Such a process
    holds nothing any more, but ``kill(pid, 0)`` still finds it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False  # no /proc here, or gone meanwhile (kill decides)
    # The command name in parentheses may hold spaces and parentheses; the state follows the
    # last closing one.
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state in (b"Z", b"X")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs (an exited, unreaped process does not)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # it exists (another user's process)
    return not _is_zombie(pid)


def holder_alive(row: Any) -> bool | None:
    """Whether the holder of a lease or write row (with ``host`` and ``pid``) is alive: False
    when its process is known to be gone, None when that cannot be told from here (another
    machine or PID namespace: its lease's expiry decides)."""
    if row.host != HOST or int(row.pid) <= 0:
        return None  # another machine, or no holder process (a detached write)
    return process_alive(int(row.pid))
