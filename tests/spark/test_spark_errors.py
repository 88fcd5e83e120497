"""What a user sees when format("arrowlake") refuses an option: arrowlake's message on the
first line of Spark's error, not after a Python traceback of arrowlake's internals."""

from __future__ import annotations

import pyarrow as pa
import pytest

import arrowlake as al

pytest.importorskip("pyspark")

from pyspark.errors import PySparkException


@pytest.fixture
def lake_path(tmp_path):
    path = tmp_path / "lake"
    lake = al.connect(path)
    t = lake.create_table("s.f", pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    t.append({"id": [1, 2], "x": [1.0, float("nan")]})
    return path


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


@pytest.mark.parametrize("bad, message", [
    ("x >", "arrowlake.errors.FilterSyntaxError: Expected a value after '>', found the end "
            "of the filter at position 3"),
    ("nope = 1", "arrowlake.errors.ColumnNotFound: Column 'nope' in the filter does not "
                 "exist; available columns: id, x"),
    ("x = 'abc'", "arrowlake.errors.ValidationError: Cannot compare column 'x' of type double "
                  "with 'abc' (str) in x = 'abc': 'abc' is not a number"),
])
def test_a_bad_filter_option_puts_arrowlakes_message_first(spark, lake_path, bad, message):
    with pytest.raises(PySparkException) as caught:
        (spark.read.format("arrowlake").option("lake", str(lake_path)).option("filter", bad)
         .load("s.f").collect())
    assert message in first_line(caught.value), str(caught.value)
    assert "Traceback" not in str(caught.value)
    assert "arrowlake/spark/source.py" not in str(caught.value)


def test_other_refusals_put_the_message_first_too(spark, lake_path):
    with pytest.raises(PySparkException) as caught:
        spark.read.format("arrowlake").option("lake", str(lake_path)).load("s.missing")
    assert "arrowlake.errors.TableNotFound" in first_line(caught.value), str(caught.value)
    df = spark.createDataFrame([(3, 1.0)], "id long, x double")
    with pytest.raises(PySparkException) as caught:
        (df.write.format("arrowlake").option("lake", str(lake_path)).option("write", "merge")
         .mode("append").save("s.f"))
    assert "Unknown option write='merge': use append, upsert or changes" \
        in first_line(caught.value), str(caught.value)
    assert "Traceback" not in str(caught.value)
