"""Item 13 (metastore part): names, tags and commit ids every metastore can store, checked up
front with an arrowlake error, never a driver error or a silently changed name."""

from __future__ import annotations

import pyarrow as pa
import pytest

from arrowlake.errors import InvalidName, ValidationError
from tests.conftest import METASTORES, make_lake

BAD_NAMES = ["t\n", "\nt", "t\x00", "x" * 256, ""]


@pytest.mark.parametrize("kind", METASTORES)
def test_names_with_newlines_nul_or_too_long_are_refused(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    schema = pa.schema([("id", pa.int64())])
    for bad in BAD_NAMES:
        with pytest.raises(InvalidName):
            lake.create_table(bad, schema)
        with pytest.raises(InvalidName):
            lake.create_table(f"{bad}.t", schema)
        with pytest.raises(InvalidName):
            lake.create_namespace(bad)
        with pytest.raises(InvalidName):
            lake.table(bad)
        # The metastore checks too, for callers that bypass the lake's stricter rules.
        with pytest.raises(InvalidName):
            lake.metastore.create_namespace(bad)
    assert lake.tables() == []
    assert lake.namespaces() == []
    lake.create_table("t", schema)
    for bad in BAD_NAMES:
        with pytest.raises(InvalidName):
            lake.rename_table("t", bad)
    assert lake.tables() == ["default.t"]
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_bad_tag_names_and_commit_ids_are_refused_before_writing(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    for bad in BAD_NAMES:
        with pytest.raises(InvalidName):
            t.create_tag(bad)
        with pytest.raises(InvalidName):
            t.scan(tag=bad)
        with pytest.raises(InvalidName):
            t.drop_tag(bad)
    assert t.tags() == {}
    t.create_tag("release 1.0 (é)")  # tags are free text otherwise
    assert t.tags() == {"release 1.0 (é)": 1}
    for bad in ["c\x00", "c" * 256, ""]:
        with pytest.raises(ValidationError, match="commit_id"):
            t.append({"id": [2]}, commit_id=bad)
        with pytest.raises(ValidationError, match="commit_id"):
            t.delete("id = 1", commit_id=bad)
        with pytest.raises(ValidationError, match="commit_id"):
            t.overwrite({"id": [2]}, commit_id=bad)
    assert t.append({"id": [2]}, commit_id="c" * 255).snapshot_id == 2
    assert t.snapshots().num_rows == 2
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]
    assert len(t.files()) == 2
    lake.close()


def test_column_names_with_a_trailing_newline_are_refused(sqlite_lake):
    with pytest.raises(InvalidName):
        sqlite_lake.create_table("n.t", pa.schema([("a\n", pa.int64())]))
    t = sqlite_lake.create_table("n.u", pa.schema([("a", pa.int64())]))
    with pytest.raises(InvalidName):
        t.add_column("b\n", pa.int64())
    assert t.schema.names == ["a"]
