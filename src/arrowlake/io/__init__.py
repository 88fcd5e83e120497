"""Storage backends and Parquet file writing/reading with statistics."""
