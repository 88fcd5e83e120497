"""The default lake of the environment: ARROWLAKE_LAKE, ARROWLAKE_WAREHOUSE,
ARROWLAKE_STORAGE_OPTIONS."""

from __future__ import annotations

import pytest

from arrowlake.errors import ValidationError
from arrowlake.lake import lake_address


def test_a_named_lake_ignores_the_environment():
    env = {"ARROWLAKE_LAKE": "/elsewhere", "ARROWLAKE_WAREHOUSE": "s3://w",
           "ARROWLAKE_STORAGE_OPTIONS": '{"region": "x"}'}
    where = lake_address("/lake", environ=env)
    assert (where.uri, where.warehouse, dict(where.storage_options)) == ("/lake", None, {})


def test_the_environment_names_lake_warehouse_and_storage():
    env = {"ARROWLAKE_LAKE": "postgresql://u@h/db", "ARROWLAKE_WAREHOUSE": "s3://bucket/lake",
           "ARROWLAKE_STORAGE_OPTIONS": '{"region": "eu", "endpoint": "http://a"}'}
    where = lake_address(None, storage_options={"endpoint": "http://b"}, environ=env)
    assert where.uri == "postgresql://u@h/db" and where.warehouse == "s3://bucket/lake"
    assert dict(where.storage_options) == {"region": "eu", "endpoint": "http://b"}
    assert lake_address(None, warehouse="/w", environ=env).warehouse == "/w"


def test_no_lake_anywhere_names_the_variable():
    with pytest.raises(ValidationError, match=r"option\('lake'.*\$ARROWLAKE_LAKE"):
        lake_address(None, environ={}, given_by="option('lake', ...)")


@pytest.mark.parametrize("text", ["{bad", "[1, 2]"])
def test_bad_storage_options_name_the_variable(text):
    env = {"ARROWLAKE_LAKE": "/lake", "ARROWLAKE_STORAGE_OPTIONS": text}
    with pytest.raises(ValidationError, match=r"\$ARROWLAKE_STORAGE_OPTIONS"):
        lake_address(None, environ=env)


def test_the_environment_lake_connects(tmp_path, monkeypatch):
    monkeypatch.setenv("ARROWLAKE_LAKE", str(tmp_path))
    with lake_address().connect() as lake:
        assert lake.warehouse == str(tmp_path)
