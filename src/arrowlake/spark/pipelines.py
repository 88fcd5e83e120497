"""arrowlake tables as the datasets of Spark Declarative Pipelines (``pyspark.pipelines``).

``spark-pipelines run`` writes a streaming table (``@dp.table(format="arrowlake")``,
``dp.create_streaming_table(..., format="arrowlake")`` with ``@dp.append_flow``) through
``writeStream.format("arrowlake").queryName(<flow>).option("checkpointLocation", ...)
.toTable(<dataset>)``. PySpark (4.1-4.3) hands the writer only those two options: not the
dataset's name, not its ``table_properties``, not a lake. So:

- the lake is the default lake of the environment (``$ARROWLAKE_LAKE``, see
  :func:`arrowlake.lake.lake_address`), unless a ``lake`` option names one;
- the table is read from the flow's checkpoint location, which the pipeline lays out as
  ``<storage>/_checkpoints/<catalog>/<database>/<dataset>/<flow>/<n>`` next to the query name
  ``<catalog>.<database>.<flow>``: the dataset lands as the arrowlake table
  ``<database>.<dataset>``, created from the flow's schema when missing (a plain append table:
  a table that needs a primary key or properties is created beforehand with arrowlake);
- the first micro-batch of the dataset's own flow under a fresh checkpoint (a new dataset, or
  ``--full-refresh``, which starts checkpoint ``n + 1``) replaces the table's rows in one
  commit; every later batch, and every batch of an ``@dp.append_flow``, appends (an upsert on a
  primary-key table, changes when the input has ``_row_kind``).

A materialized view (``@dp.materialized_view(format="arrowlake")``) is written by a batch
``saveAsTable`` that hands the data source no options at all, so its writer cannot know which
table it writes: it is refused (see :func:`arrowlake.spark.source.table_name`).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from arrowlake.errors import TableAlreadyExists
from arrowlake.spark.source import LakeOptions, open_lake
from arrowlake.spark.types import spark_arrow_schema
from arrowlake.streaming.splits import ROW_KIND_COLUMN

if TYPE_CHECKING:
    from arrowlake.lake import Lake

#: The folder of a pipeline's storage that holds its flows' checkpoints.
CHECKPOINTS = "_checkpoints"


@dataclass(frozen=True)
class PipelineFlow:
    """A flow of a declarative pipeline, as its streaming write shows it."""

    catalog: str
    database: str
    dataset: str
    flow: str
    checkpoint: int  # n of .../<flow>/<n>: incremented by each full refresh

    @property
    def table(self) -> str:
        """The arrowlake table the dataset lands as."""
        return f"{self.database}.{self.dataset}"

    @property
    def is_default_flow(self) -> bool:
        """The dataset's own flow (``@dp.table``), not an ``@dp.append_flow`` into it."""
        return self.flow == self.dataset


def pipeline_flow(options: Mapping[str, str]) -> PipelineFlow | None:
    """The pipeline flow a streaming write belongs to, or None for a write outside a
    pipeline (or one that names its table with ``path``/``table``)."""
    if options.get("path") or options.get("table"):
        return None
    where, query = options.get("checkpointlocation"), options.get("queryname")
    if not where or not query:
        return None
    parts = str(where).rstrip("/").split("/")
    if len(parts) < 6 or parts[-6] != CHECKPOINTS or not parts[-1].isdigit():
        return None
    catalog, database, dataset, flow = parts[-5:-1]
    if str(query) != f"{catalog}.{database}.{flow}":
        return None
    return PipelineFlow(catalog, database, dataset, flow, int(parts[-1]))


def ensure_table(lake: Lake, name: str, schema: StructType) -> None:
    """Create ``name`` as an append table of ``schema`` (less ``_row_kind``) unless it
    exists."""
    if lake.table_exists(name):
        return
    arrow = spark_arrow_schema(schema)
    if ROW_KIND_COLUMN in arrow.names:
        arrow = arrow.remove(arrow.get_field_index(ROW_KIND_COLUMN))
    with suppress(TableAlreadyExists):  # another flow of the pipeline created it first
        lake.create_table(name, arrow)


def pipeline_options(options: Mapping[str, str], schema: StructType
                     ) -> tuple[dict[str, str], PipelineFlow | None]:
    """The options of a streaming write, with ``path`` naming the dataset's table when the
    write is a pipeline's flow (the table is created when missing), and that flow."""
    opts = dict(options)
    flow = pipeline_flow(opts)
    if flow is not None:
        opts["path"] = flow.table
        ensure_table(open_lake(LakeOptions.from_options(opts)), flow.table, schema)
    return opts, flow
