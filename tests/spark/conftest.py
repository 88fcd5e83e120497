"""One local Spark for the whole run (the Spark tests share it; starting one takes seconds)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import arrowlake

pytest.importorskip("pyspark", reason="the spark extra is not installed")


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Python workers run this interpreter and import the arrowlake under test (and its
    # pyspark_arrowlake module, which registers the format).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    src = str(Path(arrowlake.__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [src, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    session = (SparkSession.builder.master("local[2]")
               .appName("arrowlake-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "1g")
               .config("spark.python.worker.reuse", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def pushdown(spark):
    """Filter pushdown on for one test."""
    key = "spark.sql.python.filterPushdown.enabled"
    spark.conf.set(key, "true")
    yield
    spark.conf.set(key, "false")
