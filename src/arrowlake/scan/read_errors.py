"""Read failures caused by a damaged data file, named as such.

A Parquet read that fails with an I/O or decoding error may be the storage failing, a bug, or
one of the split's files being missing, truncated, overwritten or undecodable. :func:`checked`
wraps a split reader so that the last case becomes a :class:`~arrowlake.errors.DataFileError`
that names the table and the file and says what to do; any other failure stays as it was.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from arrowlake.errors import DataFileError, StorageError
from arrowlake.io.storage import Storage, data_file_damage


class _File(Protocol):
    """What the checks need of a split's file (a :class:`~arrowlake.scan.split.FileTask`)."""

    @property
    def path(self) -> str: ...
    @property
    def file_size(self) -> int: ...


class _Split(Protocol):
    """What the checks need of a split (a :class:`~arrowlake.scan.split.Split`, whose module
    reads through this one)."""

    @property
    def table(self) -> str | None: ...
    @property
    def storage(self) -> Storage: ...
    @property
    def files(self) -> Sequence[_File]: ...

_CHECKED = "_arrowlake_files_checked"


@contextlib.contextmanager
def _reading(split: _Split) -> Iterator[None]:
    """Reading the split's files: a failure caused by a damaged data file (missing, truncated,
    overwritten, not decodable) becomes a :class:`DataFileError` naming the table and the file;
    any other failure stays as it is."""
    try:
        yield
    except DataFileError:
        raise
    except (OSError, pa.ArrowInvalid) as exc:
        if getattr(exc, _CHECKED, False):
            raise  # a nested read (a merge's runs) checked its files already
        found = _damaged_file(split, exc)
        if found is None:
            with contextlib.suppress(AttributeError):
                setattr(exc, _CHECKED, True)
            raise
        task, damage = found
        table = f"Table '{split.table}'" if split.table else "The table"
        raise DataFileError(
            f"{table} cannot be read: its data file {task.path} {damage}. Restore the file "
            "(from a backup or replica), or read a snapshot from before the file was added "
            "(table.snapshots(), table.scan(snapshot=...)); writes that must read the file "
            "(deletes, compaction) fail the same way until then") from exc


def _damaged_file(split: _Split, exc: BaseException) -> tuple[_File, str] | None:
    """The file of the split that caused ``exc`` and what is wrong with it, if a file did."""
    storage = split.storage
    message = str(exc)
    named = [f for f in split.files
             if f.path in message or storage.fs_path(f.path) in message]
    try:
        # The file the error names first, then cheap checks (exists, size, trailer) of all,
        # then, as decoding failures name no file, a full read of each in turn.
        for read_all in (False, True):
            for task in [*named, *split.files] if read_all else (named or split.files):
                damage = data_file_damage(storage, task.path, task.file_size,
                                          read_all=read_all)
                if damage is not None:
                    return task, damage
    except StorageError:
        return None  # the storage itself fails: the original error says how
    return None


_F = TypeVar("_F", bound=Callable[..., Any])


def checked(read: _F) -> _F:
    """``read(split, ...)`` (a function or a generator) raising :class:`DataFileError` for a
    damaged file of the split."""
    if inspect.isgeneratorfunction(read):
        @functools.wraps(read)
        def generator(split: _Split, *args: Any, **kwargs: Any) -> Any:
            with _reading(split):
                yield from read(split, *args, **kwargs)

        return generator  # type: ignore[return-value]

    @functools.wraps(read)
    def function(split: _Split, *args: Any, **kwargs: Any) -> Any:
        with _reading(split):
            return read(split, *args, **kwargs)

    return function  # type: ignore[return-value]
