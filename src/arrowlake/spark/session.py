"""What arrowlake asks of a Spark session, for classic sessions and Spark Connect alike.

A Spark Connect client (``SparkSession.builder.remote("sc://...")``) has no JVM and no
``sparkContext``: whatever arrowlake learned through them it learns here from SQL the server
answers, without importing any of PySpark's Connect modules (which need the client's gRPC
packages). Answers are kept per session: they do not change while it lives.
"""

from __future__ import annotations

import os
import re
import weakref
from typing import Any

from arrowlake.errors import ValidationError

#: Per session, what was learned of it.
_KNOWN: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_SPLITS = re.compile(r"\bsplits=(\d+)")
_VERSION = re.compile(r"(\d+)\.(\d+)")
_CLASS_NAME = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*")
#: Loads a class as Spark loads its data sources and file systems: with the jars of
#: ``spark.jars`` / ``spark.jars.packages`` (on the context class loader, not the system one).
#: ``try_reflect`` returns NULL where the call throws (a class that is not there).
_PROBE_SQL = ("SELECT try_reflect('org.apache.spark.util.Utils', 'classForName', :name, "
              "true, false)")


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client session (told by its class's module, so
    neither the JVM nor the Connect client's packages are touched)."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def _known(spark: Any) -> dict[str, Any]:
    known = _KNOWN.get(spark)
    if known is None:
        known = _KNOWN[spark] = {}
    return known


def spark_version(spark: Any) -> tuple[int, int]:
    """The (major, minor) version of the Spark that runs ``spark``'s queries (the server's,
    under Spark Connect), asked once per session."""
    known = _known(spark)
    if "version" not in known:
        found = _VERSION.match(str(spark.version))
        known["version"] = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    version: tuple[int, int] = known["version"]
    return version


def default_parallelism(spark: Any) -> int:
    """How many tasks Spark runs at once by default (``sparkContext.defaultParallelism``).

    Under Spark Connect it is read from the plan the server makes for ``range``, which Spark
    splits by its default parallelism: ``EXPLAIN`` returns that plan without running a job.
    """
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    known = _known(spark)
    if "parallelism" not in known:
        plan = spark.sql("EXPLAIN SELECT id FROM range(1)").collect()[0][0]
        found = _SPLITS.search(plan)
        known["parallelism"] = int(found.group(1)) if found else os.cpu_count() or 1
    return int(known["parallelism"])


def has_class(spark: Any, name: str) -> bool:
    """Whether Spark can load the JVM class ``name`` (``a.b.C``) as it loads file systems,
    jars of ``spark.jars.packages`` included.

    A classic session asks its JVM; a Spark Connect client asks the server with SQL
    (``try_reflect`` of Spark's ``Utils.classForName``, NULL when the class is missing).
    """
    if not _CLASS_NAME.fullmatch(name):
        raise ValidationError(f"has_class: {name!r} is not a JVM class name (a.b.C)")
    classes = _known(spark).setdefault("classes", {})
    if name not in classes:
        if is_connect(spark):
            found = spark.sql(_PROBE_SQL, args={"name": name}).collect()[0][0] is not None
        else:
            try:
                spark._jvm.org.apache.spark.util.Utils.classForName(name, True, False)
                found = True
            except Exception:  # py4j's error for the JVM's ClassNotFoundException
                found = False
        classes[name] = found
    return bool(classes[name])
