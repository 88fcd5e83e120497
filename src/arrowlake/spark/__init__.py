"""arrowlake for Apache Spark, through PySpark's Python Data Source API (PySpark 4.1+).

``spark.read.format("arrowlake")`` and ``df.write.format("arrowlake")`` work as soon as this
package is installed (PySpark finds the ``pyspark_arrowlake`` module); :func:`register` does the
same explicitly. :func:`read` reads through Spark's own Parquet reader wherever no merge is
needed (see :mod:`arrowlake.spark.fast`).

>>> import arrowlake.spark                                           # doctest: +SKIP
>>> df = (spark.read.format("arrowlake").option("lake", "./lake")    # doctest: +SKIP
...            .load("shop.orders"))
"""

from __future__ import annotations

from typing import Any

from arrowlake.errors import require

require("pyspark", "spark", "arrowlake.spark")

from arrowlake.spark.fast import FastReadPlan, plan_read, read  # noqa: E402
from arrowlake.spark.source import FORMAT  # noqa: E402
from arrowlake.spark.stream import ArrowlakeDataSource, foreach_batch_sink  # noqa: E402


def register(spark: Any) -> None:
    """Register the ``arrowlake`` format with ``spark`` (not needed when PySpark finds
    ``pyspark_arrowlake`` on its own, which it does wherever arrowlake is installed)."""
    spark.dataSource.register(ArrowlakeDataSource)


__all__ = ["FORMAT", "ArrowlakeDataSource", "FastReadPlan", "foreach_batch_sink", "plan_read",
           "read", "register"]
