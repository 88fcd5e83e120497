"""Arrow ↔ pandas conversions that keep what a DataFrame's dtypes say.

Arrow cannot express some pandas dtypes by its types alone (nullable integers, categoricals,
...): a table created from a DataFrame keeps each such dtype in its field's metadata
(``PANDAS_DTYPE_KEY``), and :func:`arrow_to_pandas` restores it. Creating tables from DataFrames
is :mod:`arrowlake.integrations.pandas`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from arrowlake.errors import require
from arrowlake.schema import PANDAS_DTYPE_KEY

if TYPE_CHECKING:
    import pandas as pd


def pandas_to_arrow(df: Any, schema: pa.Schema | None = None) -> pa.Table:
    """``df`` as an Arrow table; an index other than a default ``RangeIndex`` is kept."""
    index = df.index
    # A default RangeIndex carries nothing; any other index is data the user may want kept.
    preserve = not (type(index).__name__ == "RangeIndex" and index.name is None)
    return pa.Table.from_pandas(df, schema=schema, preserve_index=preserve if schema is None
                                else False)


def arrow_to_pandas(table: pa.Table, **kwargs: Any) -> pd.DataFrame:
    """``table.to_pandas()`` that restores the pandas dtypes recorded in field metadata."""
    pd = require("pandas", "pandas", "to_pandas()")
    recorded = {f.name: (f.metadata or {}).get(PANDAS_DTYPE_KEY) for f in table.schema}
    recorded = {k: v.decode() for k, v in recorded.items() if v is not None}
    if not recorded:
        return table.to_pandas(**kwargs)
    arrays = []
    for field, col in zip(table.schema, table.columns, strict=True):
        if recorded.get(field.name) == "category" and not pa.types.is_dictionary(col.type):
            col = col.dictionary_encode()  # Arrow dictionaries become pandas Categoricals
        arrays.append(col)
    df = pa.Table.from_arrays(arrays, names=table.schema.names).to_pandas(**kwargs)
    for name, dtype_name in recorded.items():
        if dtype_name == "category":
            continue
        dtype = pd.api.types.pandas_dtype(dtype_name)
        col = table.column(name)
        df[name] = col.to_pandas(types_mapper=lambda t, c=col, d=dtype: d if t == c.type
                                 else None)
    return df
