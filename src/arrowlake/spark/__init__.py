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

from typing import TYPE_CHECKING, Any

from arrowlake.errors import require
from arrowlake.lazy import lazy_exports, lazy_module

require("pyspark", "spark", "arrowlake.spark")

if TYPE_CHECKING:
    from arrowlake.spark import stream as _stream
    from arrowlake.spark.fast import FastReadPlan, plan_read, read
    from arrowlake.spark.maintenance import compact, remove_orphan_files
    from arrowlake.spark.source import FORMAT
    from arrowlake.spark.stream import ArrowlakeDataSource, foreach_batch_sink
    from arrowlake.spark.transactions import BatchTransaction, foreach_batch_transaction
else:
    _stream = lazy_module("arrowlake.spark.stream")

# Imported on first use: an executor's Python worker that reads splits imports
# arrowlake.spark.stream (the source class) and no more.
__getattr__, __dir__ = lazy_exports(__name__, {
    "ArrowlakeDataSource": "arrowlake.spark.stream",
    "FORMAT": "arrowlake.spark.source",
    "FastReadPlan": "arrowlake.spark.fast",
    "compact": "arrowlake.spark.maintenance",
    "foreach_batch_sink": "arrowlake.spark.stream",
    "foreach_batch_transaction": "arrowlake.spark.transactions",
    "BatchTransaction": "arrowlake.spark.transactions",
    "plan_read": "arrowlake.spark.fast",
    "read": "arrowlake.spark.fast",
    "remove_orphan_files": "arrowlake.spark.maintenance",
})


def register(spark: Any) -> None:
    """Register the ``arrowlake`` format with ``spark`` (not needed when PySpark finds
    ``pyspark_arrowlake`` on its own, which it does wherever arrowlake is installed)."""
    spark.dataSource.register(_stream.ArrowlakeDataSource)


__all__ = ["FORMAT", "ArrowlakeDataSource", "BatchTransaction", "FastReadPlan", "compact",
           "foreach_batch_sink", "foreach_batch_transaction", "plan_read", "read", "register",
           "remove_orphan_files"]
