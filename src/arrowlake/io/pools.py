"""Thread pools whose tasks run in the context of the code that submitted them.

``concurrent.futures`` runs a task with none of the submitting thread's context variables.
arrowlake keeps one in them that file writers read: the write in flight that files belong to
(``metastore/inflight.py``). A task that writes files for a write (a compaction merging a
bucket on a pool thread, a row group compressed on the write pool) must name them after that
write, so every pool that may write files is a :class:`ContextPool`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

_T = TypeVar("_T")


class ContextPool(ThreadPoolExecutor):
    """A ThreadPoolExecutor running each task in a copy of its submitter's context."""

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)
