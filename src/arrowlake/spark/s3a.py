"""Spark's S3A connector for a lake's files on S3: settings, paths and whether Spark has it.

Spark's own Parquet reader reaches S3 only through Hadoop's S3A filesystem, which is not in
the PySpark wheel: ``spark.jars.packages`` adds it (:func:`s3a_package` names the artifact
matching the wheel's Hadoop). A lake's storage options (obstore's keys: ``endpoint``,
``region``, ``access_key_id``, ``secret_access_key``, ``session_token``,
``virtual_hosted_style_request``, ``skip_signature``) become S3A settings scoped to one bucket
(``fs.s3a.bucket.<bucket>.*``), handed to Spark as options of the one read that needs them:
Spark gives a file source's options to the Hadoop configuration of that read alone (its
listing on the driver and its tasks), so nothing lands in the session's configuration, and
no option of a read appears in its plan string, the event log or the UI.

Options S3A has no setting for (an AWS ``profile``) leave the files to the arrowlake data
source, which reads them with the lake's own object store client.
"""

from __future__ import annotations

import glob
import os
import threading
import warnings
from collections.abc import Mapping
from functools import cache
from typing import Any

from arrowlake.spark.session import has_class

#: The class Spark needs on its classpath to read ``s3a://`` paths.
S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_TRUE = {"1", "true", "yes", "on"}
#: Storage options S3A has no per-bucket setting for: files of such a lake are read through
#: the data source.
_UNMAPPED = frozenset({"profile", "credentials_url", "container_credentials_relative_uri",
                       "web_identity_token_file", "role_arn"})


@cache
def hadoop_version() -> str | None:
    """The Hadoop version of the PySpark wheel (its ``hadoop-client-api`` jar), if found."""
    try:
        import pyspark
    except ImportError:
        return None
    jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars",
                                  "hadoop-client-api-*.jar"))
    if not jars:
        return None
    return os.path.basename(sorted(jars)[-1])[len("hadoop-client-api-"):-len(".jar")]


def s3a_package() -> str:
    """The Maven coordinate of Hadoop's S3A connector for this PySpark (for
    ``spark.jars.packages``; it brings the AWS SDK bundle it needs)."""
    return f"org.apache.hadoop:hadoop-aws:{hadoop_version() or '<the Hadoop version of Spark>'}"


def is_s3(path: str) -> bool:
    return path.startswith(("s3://", "s3a://"))


def s3a_path(path: str) -> str:
    """``s3://bucket/key`` as S3A names it (``s3a://bucket/key``)."""
    return "s3a://" + path.split("://", 1)[1]


def bucket_of(path: str) -> str:
    return path.split("://", 1)[1].split("/", 1)[0]


def _normalized(options: Mapping[str, Any]) -> dict[str, Any]:
    """Storage options with obstore's aliases folded (``AWS_REGION``, ``aws_region`` and
    ``region`` are one key), client options flattened."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key == "client_options" and isinstance(value, Mapping):
            out.update(_normalized(value))
            continue
        name = str(key).lower().removeprefix("aws_")
        name = {"endpoint_url": "endpoint", "default_region": "region",
                "token": "session_token"}.get(name, name)
        out[name] = value
    return out


def s3a_options(bucket: str, storage_options: Mapping[str, Any]) -> dict[str, str] | None:
    """The S3A settings for ``bucket`` that reach it as the lake's storage options say, as
    options of a Spark read; None when some option has no S3A setting."""
    opts = _normalized(storage_options)
    if _UNMAPPED & opts.keys():
        return None
    prefix = f"fs.s3a.bucket.{bucket}."
    out: dict[str, str] = {}
    endpoint = opts.get("endpoint")
    if endpoint:
        out["endpoint"] = str(endpoint)
        out["connection.ssl.enabled"] = str(not str(endpoint).startswith("http://")).lower()
    if opts.get("region"):
        out["endpoint.region"] = str(opts["region"])
    vhost = opts.get("virtual_hosted_style_request")
    if vhost is not None:
        out["path.style.access"] = str(str(vhost).lower() not in _TRUE).lower()
    elif endpoint:
        out["path.style.access"] = "true"  # obstore's default for a custom endpoint
    if str(opts.get("skip_signature", "")).lower() in _TRUE:
        out["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
    elif opts.get("access_key_id") and opts.get("secret_access_key"):
        out["access.key"] = str(opts["access_key_id"])
        out["secret.key"] = str(opts["secret_access_key"])
        if opts.get("session_token"):
            out["session.token"] = str(opts["session_token"])
            out["aws.credentials.provider"] = \
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            out["aws.credentials.provider"] = \
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return {prefix + k: v for k, v in out.items()}


_WARNED = threading.Event()


def has_s3a(spark: Any) -> bool:
    """Whether Spark (the classic session's JVM, or a Spark Connect client's server) can load
    S3A; asked once per session (:func:`arrowlake.spark.session.has_class`)."""
    return has_class(spark, S3A_CLASS)


def warn_missing() -> None:
    """Say once per process that files on S3 go through the data source for want of S3A."""
    if not _WARNED.is_set():
        _WARNED.set()
        warnings.warn(
            f"Spark has no S3A ({S3A_CLASS}) on its classpath, so arrowlake.spark.read reads "
            "files on S3 through the arrowlake data source, several times slower than Spark's "
            f"Parquet reader: start Spark with spark.jars.packages={s3a_package()}",
            RuntimeWarning, stacklevel=4)
