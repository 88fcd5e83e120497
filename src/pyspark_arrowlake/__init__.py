"""Makes ``spark.read.format("arrowlake")`` work with no registration call.

PySpark looks for installed top-level modules named ``pyspark_*`` that define ``DefaultSource``
(a ``pyspark.sql.datasource.DataSource``) and registers each under its ``name()``.
"""

from arrowlake.spark.stream import ArrowlakeDataSource as DefaultSource

__all__ = ["DefaultSource"]
