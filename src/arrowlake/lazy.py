"""Imports deferred to first use, so that a process imports only the modules it runs.

A Spark executor's Python worker reads splits: it needs pyarrow and the read path, not the
SQL metastore (SQLAlchemy), the writers or the engine adapters that the driver uses. Two forms:

- :func:`lazy_module`: a module-level name bound to a module that is imported on its first
  attribute access (``lakes = lazy_module("arrowlake.lake")`` ... ``lakes.connect(...)``).
  For type checking, import the same module under ``if TYPE_CHECKING:``;
  ``tests/test_layers.py`` checks these names against the layers like any import.
- :func:`lazy_exports`: a package's public names (PEP 562 module ``__getattr__``), each
  imported from its module on first access and then kept in the package's namespace.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands in for module ``name`` until an attribute is read; then imports it (the import
    system's lock makes concurrent first uses safe) and reads from it."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # A function pickled by value (cloudpickle) may carry one: it travels as its name.
        return lazy_module, (self._name,)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


def lazy_module(name: str) -> Any:
    """Module ``name``, imported when one of its attributes is first read."""
    return LazyModule(name)


def lazy_exports(package: str, exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each public name to
    the module defining it (a name equal to a submodule's is that submodule)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where)
        value = module if where == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
