"""A Structured Streaming micro-batch written to several tables in one lake transaction.

``foreach_batch_transaction(lake, write)`` is a ``foreachBatch`` function: for each batch it
opens a lake transaction whose commit id is ``spark-stream:<query id>:<batch id>`` and calls
``write(batch_df, batch_id, tx)``, where ``tx.write(df, table, mode=...)`` has Spark tasks write
``df``'s partitions as files of ``table`` (under the transaction's registration, so orphan
removal leaves them alone) and joins them to the transaction. When ``write`` returns, every
table's files commit at once, with the batch id in the same commit: a batch Spark replays after
a crash finds its commit id and commits nothing, so every row lands exactly once across
restarts, in every table or none.

>>> def fan_out(batch, batch_id, tx):                           # doctest: +SKIP
...     tx.write(batch.where("kind = 'order'"), "shop.orders")
...     tx.write(batch.where("kind = 'line'").drop("kind"), "shop.lines", mode="upsert")
>>> (events.writeStream.foreachBatch(foreach_batch_transaction("./lake", fan_out))
...        .option("checkpointLocation", "/tmp/ck").start())     # doctest: +SKIP
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from arrowlake.errors import ValidationError
from arrowlake.spark.source import LakeOptions, open_lake
from arrowlake.spark.stream import batch_query_id
from arrowlake.spark.types import from_spark_batch
from arrowlake.table import staged as staging
from arrowlake.table.staged import WRITE_MODES, StagedWrite, WriteMode, WriteTarget

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from arrowlake.table.transaction import Pending, Transaction
    from arrowlake.table.writes.commit import WriteResult

class BatchTransaction:
    """What ``write`` gets for a batch: ``write(df, table, ...)`` joins a DataFrame's rows to
    the batch's lake transaction."""

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx

    @property
    def transaction(self) -> Transaction:
        """The lake transaction itself (its reads see the tables as of the batch's start)."""
        return self._tx

    def write(self, df: DataFrame, table: str, mode: WriteMode = "append", *,
              row_kind: str = "op") -> Pending[WriteResult]:
        """Write ``df`` into ``table`` within the batch's transaction: ``mode`` ``append``
        (an upsert on a primary-key table), ``upsert``, ``changes`` (column ``row_kind`` holds
        ``+I -U +U -D``) or ``overwrite``. Spark's tasks write the files; the driver commits
        them with the batch."""
        if mode not in WRITE_MODES:
            raise ValidationError(
                f"Unknown write mode {mode!r}; use one of {', '.join(WRITE_MODES)}")
        target_table = self._tx.table(table)
        state = target_table.state
        staging.check_mode(state, mode, None)
        target = WriteTarget(state.record, state.storage, state.schema, self._tx.write_id)
        schema = target.schema
        if mode == "changes":
            schema = schema.append(pa.field(row_kind, pa.string()))
        blobs = df.mapInArrow(partial(_stage_partition, target, mode, row_kind, schema),
                              "staged binary").toArrow().column("staged").to_pylist()
        stages: list[StagedWrite] = [pickle.loads(b) for b in blobs]
        return target_table.write_staged(stages, mode)


def _stage_partition(target: WriteTarget, mode: WriteMode, row_kind: str, schema: pa.Schema,
                     batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task: its partition's rows written as files of the target (nothing committed)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    order = context.partitionId() if context is not None else 0
    converted = (from_spark_batch(b, schema) for b in batches)
    reader = pa.RecordBatchReader.from_batches(schema, converted)
    staged = staging.stage(target, reader, mode, row_kind=row_kind, order=order)
    yield pa.record_batch({"staged": pa.array([pickle.dumps(staged)], pa.binary())})


def foreach_batch_transaction(lake: str | None,
                              write: Callable[[DataFrame, int, BatchTransaction], None], *,
                              queryId: str | None = None, warehouse: str | None = None,
                              storage_options: Mapping[str, Any] | None = None
                              ) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function committing what ``write`` writes for each batch in one
    lake transaction with commit id ``spark-stream:<query id>:<batch id>`` (see the module
    docs). ``lake`` None: the lake of ``$ARROWLAKE_LAKE``. Under Spark Connect, pass
    ``queryId``: a name of the query's own that it keeps when it restarts from its
    checkpoint."""
    given = {"lake": lake, "warehouse": warehouse,
             "storageoptions": None if storage_options is None
             else json.dumps(dict(storage_options))}
    where = LakeOptions.from_options({k: v for k, v in given.items() if v is not None})

    def run(batch_df: DataFrame, batch_id: int) -> None:
        query = batch_query_id(batch_df, queryId, "foreach_batch_transaction")
        with open_lake(where).transaction(commit_id=f"spark-stream:{query}:{batch_id}") as tx:
            write(batch_df, batch_id, BatchTransaction(tx))

    return run
