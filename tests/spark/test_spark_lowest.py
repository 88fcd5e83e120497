"""The Spark tests that touch files, run on the lowest PySpark pyproject.toml claims.

The main environment has the newest PySpark; ``client_python("spark41")``
(tests/client_envs.py) is a virtualenv with exactly ``PYSPARK_LOWEST``, arrowlake's
dependencies and pytest, without arrowlake, built once outside the clone. The test files
below run there with ``src/`` on the path, in a pytest of their own (its own local Spark).

Both tests are slow (a pytest of its own with its own Spark: three minutes for the first,
about ten for the second); CI runs them, a default run does not.

- ``test_file_touching_spark_tests_pass_on_the_lowest_pyspark`` takes the tests a PySpark 4.1
  user would hit first: the data source found and reading, writing and streaming (with what
  4.1 refuses), the fast path over float columns with NaN (filters) and over files written
  with BYTE_STREAM_SPLIT floats, deletion vectors, and arrowlake's errors coming first. Run
  it alone for a quick check of 4.1 (``-m slow -k file_touching``).
- ``test_every_spark_test_file_passes_on_the_lowest_pyspark`` takes every Spark test file
  there is but test_spark_s3.py; it covers the first, which it therefore skips when both are
  selected.
"""

from __future__ import annotations

import os
import subprocess
import tomllib

import pytest

from tests.client_envs import PYSPARK_LOWEST, ROOT, client_python

pytest.importorskip("pyspark")

#: The default run's selection (node ids).
DEFAULT = [
    "tests/spark/test_spark_read.py::test_format_works_without_registering_and_reads_an_append_table",
    "tests/spark/test_spark_read.py::test_every_column_type_reads_as_the_table_holds_it",
    "tests/spark/test_spark_write.py::test_append_commits_every_task_in_one_snapshot",
    "tests/spark/test_spark_stream.py::test_streams_without_read_limits_and_what_pyspark_41_refuses",
    "tests/spark/test_spark_fast.py::test_deletion_vector_table_reads_through_spark_parquet_reader",
    "tests/spark/test_spark_filters.py::test_the_fast_path_returns_the_rows_of_scan_for_every_float_filter",
    "tests/spark/test_spark_encodings.py",
    "tests/spark/test_spark_errors.py::test_a_bad_filter_option_puts_arrowlakes_message_first",
]
#: Spark test files the whole run leaves out: this one, and the S3 file (its hadoop-aws setup
#: has not been tried on 4.1).
NOT_THERE = {"test_spark_lowest.py", "test_spark_s3.py"}


def run_on_lowest(tests: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    python = client_python("spark41")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                              if p]])}
    for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME"):
        env.pop(key, None)  # the conftest there sets them to that environment's Python
    version = subprocess.run([str(python), "-c", "import pyspark; print(pyspark.__version__)"],
                             env=env, capture_output=True, text=True, check=True)
    assert version.stdout.strip() == PYSPARK_LOWEST
    return subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *tests], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def report(result: subprocess.CompletedProcess[str]) -> str:
    return (f"PySpark {PYSPARK_LOWEST} run failed (exit {result.returncode}):\n"
            f"{result.stdout[-6000:]}\n{result.stderr[-2000:]}")


def test_pyproject_names_the_lowest_pyspark_exactly():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["spark"] == [f"pyspark[connect]>={PYSPARK_LOWEST}"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_file_touching_spark_tests_pass_on_the_lowest_pyspark(request):
    if any(item.name == "test_every_spark_test_file_passes_on_the_lowest_pyspark"
           for item in request.session.items):
        pytest.skip("the run of every Spark test file on the lowest PySpark is selected too, "
                    "and holds these tests")
    result = run_on_lowest(DEFAULT, timeout=850)
    assert result.returncode == 0, report(result)
    assert " passed" in result.stdout and " failed" not in result.stdout, report(result)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_spark_test_file_passes_on_the_lowest_pyspark():
    files = sorted(f"tests/spark/{p.name}" for p in (ROOT / "tests" / "spark").glob("test_*.py")
                   if p.name not in NOT_THERE)
    result = run_on_lowest(files, timeout=3500)
    assert result.returncode == 0, report(result)
