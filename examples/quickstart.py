"""arrowlake in one page: create a lake, write, overwrite, delete, scan, time travel, pandas.

Run: python examples/quickstart.py  (writes to ./quickstart-lake, removed first)
"""

from __future__ import annotations

import shutil
from datetime import date

import pandas as pd
import pyarrow as pa

import arrowlake as al

shutil.rmtree("quickstart-lake", ignore_errors=True)
lake = al.connect("quickstart-lake")  # SQLite metastore + data files under ./quickstart-lake

orders = lake.create_table(
    "shop.orders",
    schema=pa.schema([("order_id", pa.int64()), ("day", pa.date32()),
                      ("customer", pa.string()), ("amount", pa.float64())]),
    partition_by=["day"],
)
orders.append(pa.table({
    "order_id": [1, 2, 3, 4],
    "day": [date(2026, 11, 1), date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 2)],
    "customer": ["a", "b", "a", "c"],
    "amount": [10.0, -3.0, 7.5, 20.0],
}))
# Replace one partition; every new row must match the filter.
orders.overwrite(
    pd.DataFrame({"order_id": [1, 2], "day": [date(2026, 11, 1)] * 2,
                  "customer": ["a", "b"], "amount": [12.0, 4.0]}),
    filter=al.col("day") == date(2026, 11, 1),
)
orders.delete("amount < 0")

df = orders.scan(filter="day >= '2026-11-01' and customer in ('a', 'b')",
                 columns=["order_id", "amount"]).to_pandas()
print("orders of a and b:\n", df.sort_values("order_id").to_string(index=False))
print("\nfirst snapshot:", orders.scan(snapshot=1).to_arrow().num_rows, "rows")
print("count:", orders.count())
print("\nhistory:")
print(orders.snapshots().select(["snapshot_id", "parent_id", "kind", "added_rows",
                                 "removed_rows", "total_rows"]).to_pandas().to_string(index=False))

customers = lake.from_pandas(
    "shop.customers",
    pd.DataFrame({"id": pd.array([1, 2, None], dtype="Int64"),
                  "tier": pd.Categorical(["gold", "silver", "gold"])}),
    splits_num=2,
)
back = customers.to_pandas()
print("\ncustomers dtypes:", dict(back.dtypes.astype(str)))
print("tables:", lake.tables())
