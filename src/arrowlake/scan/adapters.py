"""Engine adapters for :class:`~arrowlake.scan.scan.Scan` (``to_dask``, ``to_torch``, ...).

The adapters (:mod:`arrowlake.dask`, :mod:`arrowlake.torch`) sit above the table and streaming
layers they also serve; ``Scan`` sits below them and may not import them. Each adapter module
registers its entry points here when it is imported, which :mod:`arrowlake.lake` does, so every
scan of a lake's tables has them. Registering imports no optional package: the adapters import
dask or torch only when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_ADAPTERS: dict[str, Callable[..., Any]] = {}


def register_adapter(name: str, func: Callable[..., Any]) -> None:
    """Install ``func`` as the implementation of the entry point ``name`` (e.g. ``"dask"``)."""
    _ADAPTERS[name] = func


def adapter(name: str) -> Callable[..., Any]:
    """The implementation registered as ``name``."""
    func = _ADAPTERS.get(name)
    if func is None:  # only for a table made without arrowlake.lake
        raise RuntimeError(f"No '{name}' adapter is registered: import arrowlake.lake (tables "
                           "from arrowlake.connect have every adapter)")
    return func
