"""``arrowlake iceberg``, ``arrowlake status`` and the maintenance service's publishing of the
tables that opt in with ``iceberg.publish``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.cli.main import main
from arrowlake.errors import ValidationError
from arrowlake.iceberg import PUBLISH_PROPERTY, publish_on_maintain, published

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)),
                     "name": [f"n{i}" for i in range(start, start + n)]}, SCHEMA)


@pytest.fixture
def lake_path(tmp_path: Path) -> Path:
    lake = al.connect(tmp_path / "lake")
    events = lake.create_table("shop.events", SCHEMA)
    events.append(_rows(0, 10))
    users = lake.create_table("crm.users", SCHEMA, primary_key=["id"], deletion_vectors=False)
    users.upsert(_rows(0, 10))
    users.upsert(_rows(5, 10))
    lake.close()
    return tmp_path / "lake"


def test_iceberg_command_prints_the_metadata_location(lake_path, capsys):
    assert main(["--lake", str(lake_path), "iceberg", "shop.events"]) == 0
    location = capsys.readouterr().out.strip()
    assert location.endswith(".metadata.json") and Path(location).is_file()
    assert json.loads(Path(location).read_text())["current-snapshot-id"] == 1
    assert main(["--lake", str(lake_path), "--json", "iceberg", "shop.events",
                 "--snapshot", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "table": "shop.events", "snapshot_id": 1, "metadata_location": location}


def test_iceberg_command_says_why_a_table_has_no_view(lake_path, capsys):
    assert main(["--lake", str(lake_path), "iceberg", "crm.users"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Table crm.users is a merge-on-read primary-key table")
    assert "compact(full=True)" in err


def test_status_tells_which_tables_have_a_view_and_why_not(lake_path, capsys):
    assert main(["--lake", str(lake_path), "status"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("shop",
                                                                                     "crm"))}
    assert lines["shop.events"].rstrip().endswith("on demand")
    assert lines["crm.users"].rstrip().endswith("no")
    assert "No Iceberg view:\ncrm.users: Table crm.users is a merge-on-read" in out
    assert main(["--lake", str(lake_path), "iceberg", "shop.events"]) == 0
    capsys.readouterr()
    assert main(["--lake", str(lake_path), "--json", "status", "shop.events"]) == 0
    (health,) = json.loads(capsys.readouterr().out)
    assert health["iceberg"] == {"view": True, "reason": None, "published_snapshot": 1,
                                 "current": True, "publish_on_maintain": False}


def test_maintain_publishes_the_tables_that_opt_in(lake_path):
    lake = al.connect(lake_path)
    events = lake.table("shop.events")
    other = lake.create_table("shop.other", SCHEMA)
    other.append(_rows(0, 3))
    events.set_properties(**{PUBLISH_PROPERTY: "true"})
    actions = lake.maintain(["shop.events", "shop.other"], once=True)
    assert [(a.table, a.action, a.snapshot_id) for a in actions if a.action == "iceberg"] == \
        [("shop.events", "iceberg", 1)]
    assert published(other) is None  # not opted in: published on demand only
    events.append(_rows(10, 5))
    actions = lake.maintain(["shop.events"], once=True)
    assert [a.snapshot_id for a in actions if a.action == "iceberg"] == [2]
    assert "published Iceberg metadata of snapshot 2" in actions[-1].line()
    assert published(events).snapshot_id == 2
    assert lake.maintain(["shop.events"], once=True) == []  # nothing changed: nothing written
    # A table that opted in but has no view is reported, with the reason.
    users = lake.table("crm.users")
    users.set_properties(**{PUBLISH_PROPERTY: "true"})
    (failed,) = lake.maintain(["crm.users"], once=True)
    assert failed.action == "error" and "merge-on-read" in (failed.error or "")
    lake.close()


def test_the_property_takes_true_or_false():
    assert publish_on_maintain({PUBLISH_PROPERTY: " TRUE "})
    assert not publish_on_maintain({})
    with pytest.raises(ValidationError, match="iceberg.publish"):
        publish_on_maintain({PUBLISH_PROPERTY: "yes"})


def test_tables_of_a_fresh_connection_have_the_method(lake_path):
    # Nothing imports arrowlake.iceberg there: arrowlake.connect's import chain installs it.
    code = ("import arrowlake as al, sys\n"
            "t = al.connect(sys.argv[1]).table('shop.events')\n"
            "print(t.iceberg_metadata_location())\n")
    done = subprocess.run([sys.executable, "-c", code, str(lake_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(".metadata.json")
