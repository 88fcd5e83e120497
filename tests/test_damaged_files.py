"""A data file the metastore lists but storage no longer holds intact: every read path raises
DataFileError naming the table, the file and what to do (issue item 13), on local disk and S3."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import DataFileError
from tests.conftest import put_file

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


def rows(start: int, n: int = 1000) -> dict[str, list]:
    return {"id": list(range(start, start + n)), "s": [f"value-{i}" * 3 for i in range(n)]}


def three_files(lake: al.Lake) -> tuple[al.Table, str]:
    """A table of three files; returns it and the absolute path of the middle one."""
    t = lake.create_table("shop.t", SCHEMA)
    for i in range(3):
        t.append(rows(i * 1000))
    tasks = t.scan(filter="id = 1500").plan()[0].files  # statistics keep only its file
    assert len(tasks) == 1
    return t, tasks[0].path


def damage(t: al.Table, path: str, how: str) -> None:
    storage = t._storage
    data = storage.read_bytes(path)
    if how == "missing":
        storage.delete([path])
    elif how == "truncated":
        put_file(t, path, data[: len(data) // 2])
    elif how == "overwritten":
        put_file(t, path, b"\0" * len(data))
    else:  # bytes in the pages of both columns, footer intact: only decoding notices
        footer = int.from_bytes(data[-8:-4], "little") + 8
        pages = bytearray(data)
        for at in (8, (len(data) - footer) // 2):
            pages[at:at + 32] = b"\xff" * 32
        assert (len(data) - footer) // 2 + 32 < len(data) - footer
        put_file(t, path, bytes(pages))


READS: dict[str, Callable[[al.Table], object]] = {
    "to_arrow": lambda t: t.to_arrow(),
    "to_batches": lambda t: list(t.scan(columns=["s"]).to_batches()),
    "filtered": lambda t: t.scan(filter="id > 1100 and id < 1200").to_arrow(),
    "count": lambda t: t.scan(filter="id > 1100 and id < 1200").count(),
    "split": lambda t: pickle.loads(pickle.dumps(t.scan().plan()[0])).to_arrow(),
    "delete": lambda t: t.delete("id = 1500"),
}


@pytest.mark.parametrize("how", ["missing", "truncated", "overwritten", "corrupt"])
def test_item13_damaged_data_file_raises_data_file_error(lake: al.Lake, how: str) -> None:
    t, path = three_files(lake)
    before = t.current_snapshot_id
    damage(t, path, how)
    for name, read in READS.items():
        with pytest.raises(DataFileError) as err:
            read(t)
        message = str(err.value)
        assert "'shop.t'" in message, name
        assert path in message, name
        assert "Restore the file" in message and "snapshot" in message, name
        if how == "missing":
            assert "does not exist" in message, name
    assert t.refresh().current_snapshot_id == before  # the failed delete changed nothing
    # rows in the intact files are still readable
    assert t.scan(filter="id < 1000").to_arrow().num_rows == 1000


def test_item13_damaged_file_in_a_primary_key_merge(lake: al.Lake) -> None:
    t = lake.create_table("shop.users", SCHEMA, primary_key=["id"], buckets=1,
                          deletion_vectors=False)
    t.upsert(rows(0, 500))
    t.upsert(rows(250, 500))  # overlaps the first run: reads merge both
    path = sorted(t.files().column("path").to_pylist())[0]
    damage(t, path, "missing")
    for read in (lambda: t.to_arrow(), lambda: list(t.scan().to_batches()),
                 lambda: t.scan(filter="id = 300").to_arrow(), lambda: t.count()):
        with pytest.raises(DataFileError, match=r"'shop.users'.*does not exist"):
            read()

