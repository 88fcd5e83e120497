"""The fast path on S3 without S3A on Spark's classpath (the local session has none): files go
through the data source, and one warning names the package to add. tests/cluster reads S3
through S3A."""

from __future__ import annotations

import warnings

import pyarrow as pa

import arrowlake as al
import arrowlake.spark
from arrowlake.spark import s3a
from tests.conftest import s3_warehouse

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def test_without_s3a_the_fast_path_reads_s3_through_the_source_and_warns_once(
        spark, tmp_path, request):
    warehouse, options = s3_warehouse(request)
    lake = al.connect(f"sqlite:///{tmp_path}/meta.db", warehouse=warehouse,
                      storage_options=options)
    table = lake.create_table("s.t", SCHEMA)
    table.append(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}, schema=SCHEMA))
    s3a._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = arrowlake.spark.plan_read(spark, lake, "s.t")
        rows = arrowlake.spark.read(spark, lake, "s.t").toArrow()
    assert sorted(rows.column("id").to_pylist()) == [1, 2, 3]
    assert plan.describe().startswith("0 files (0 rows) through Spark's Parquet reader")
    assert "storage Spark's reader cannot reach" in plan.describe()
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1
    assert "spark.jars.packages=org.apache.hadoop:hadoop-aws:3.5.0" in said[0]
    assert s3a.s3a_package() == "org.apache.hadoop:hadoop-aws:3.5.0"  # pyspark 4.3's Hadoop


def test_storage_options_become_s3a_settings_of_the_bucket():
    settings = s3a.s3a_options("lake", {
        "AWS_ENDPOINT": "http://127.0.0.1:9000", "aws_region": "eu-west-1",
        "access_key_id": "id", "secret_access_key": "key", "token": "session",
        "client_options": {"allow_http": True}})
    assert settings == {
        "fs.s3a.bucket.lake.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.bucket.lake.connection.ssl.enabled": "false",
        "fs.s3a.bucket.lake.endpoint.region": "eu-west-1",
        "fs.s3a.bucket.lake.path.style.access": "true",
        "fs.s3a.bucket.lake.access.key": "id", "fs.s3a.bucket.lake.secret.key": "key",
        "fs.s3a.bucket.lake.session.token": "session",
        "fs.s3a.bucket.lake.aws.credentials.provider":
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"}
    assert s3a.s3a_options("b", {"virtual_hosted_style_request": "true"}) == {
        "fs.s3a.bucket.b.path.style.access": "false"}
    # S3A has no setting for a named AWS profile: such files stay with the data source.
    assert s3a.s3a_options("b", {"profile": "prod"}) is None
