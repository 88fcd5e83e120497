"""``import arrowlake`` imports no module until one of its names is used (arrowlake/lazy.py)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import arrowlake
from arrowlake.lazy import lazy_module

SRC = str(Path(arrowlake.__file__).resolve().parent.parent)

FRESH = """
import json, sys, tempfile
import pyarrow as pa
import arrowlake
loaded = sorted(sys.modules)
from arrowlake.lake import connect   # not through the package's names
table = connect(tempfile.mkdtemp()).create_table("a.t", pa.schema([("x", pa.int64())]))
table.append(pa.table({"x": [1, 2]}))
with table.stream(stop_at_latest=True) as stream:
    streamed = sum(change.to_arrow().num_rows for change in stream)
from arrowlake.scan.adapters import adapter
print(json.dumps({"loaded": loaded, "streamed": streamed,
                  "dask": callable(adapter("dask.read"))}))
"""


def test_import_arrowlake_loads_nothing_and_a_lake_has_every_table_method():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True,
                          env=env, check=True)
    found = json.loads(done.stdout)
    assert [m for m in found["loaded"] if m.startswith("arrowlake")] == [
        "arrowlake", "arrowlake.lazy"]
    assert not {"sqlalchemy", "pandas", "pyarrow.dataset"} & set(found["loaded"])
    # Table.stream() and Scan.to_dask() are installed by modules lake.py imports.
    assert found["streamed"] == 2
    assert found["dask"] is True


def test_every_public_name_is_the_object_of_its_module():
    import importlib

    for name in arrowlake.__all__:
        module = importlib.import_module(arrowlake._EXPORTS[name])
        expected = module if module.__name__ == f"arrowlake.{name}" else getattr(module, name)
        assert getattr(arrowlake, name) is expected, name
    assert sorted(arrowlake._EXPORTS) == sorted(arrowlake.__all__)
    assert set(arrowlake.__all__) <= set(dir(arrowlake))


def test_a_lazy_module_is_imported_on_first_use_only():
    probe = lazy_module("arrowlake.never_such_module")
    assert "not imported yet" in repr(probe)  # creating it imports nothing
    with pytest.raises(ModuleNotFoundError) as raised:
        getattr(probe, "anything")  # noqa: B009
    assert raised.value.name == "arrowlake.never_such_module"
    errors = lazy_module("arrowlake.errors")
    assert errors.ValidationError is arrowlake.ValidationError
    assert "(imported)" in repr(errors)
    again = pickle.loads(pickle.dumps(probe))  # as a name: it imports nothing
    assert "not imported yet" in repr(again)
