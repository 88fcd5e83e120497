"""LocalStorage remembers the directories it made, and still writes where one was removed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from arrowlake.errors import StorageError
from arrowlake.io.storage import LocalStorage


def test_open_output_recreates_a_directory_removed_behind_its_back(tmp_path: Path) -> None:
    storage = LocalStorage()
    directory = tmp_path / "t" / "data" / "day=1"
    with storage.open_output(str(directory / "a.bin")) as out:
        out.write(b"a")
    shutil.rmtree(tmp_path / "t")  # e.g. a dropped table, by another process
    with storage.open_output(str(directory / "b.bin")) as out:
        out.write(b"b")
    assert (directory / "b.bin").read_bytes() == b"b"
    assert not (directory / "a.bin").exists()


def test_open_output_fails_clearly_where_no_directory_can_be(tmp_path: Path) -> None:
    storage = LocalStorage()
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with pytest.raises(StorageError, match="Cannot create"):
        storage.open_output(str(blocker / "a.bin"))
    directory = tmp_path / "d"
    with storage.open_output(str(directory / "a.bin")) as out:
        out.write(b"a")
    shutil.rmtree(directory)
    directory.write_bytes(b"now a file")
    with pytest.raises(StorageError, match="Cannot create"):
        storage.open_output(str(directory / "b.bin"))
